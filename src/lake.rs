//! [`LakeCache`], the face of the crate: one per process, holding every cache, and
//! [`LakeCacheBuilder`], which validates every setting before anything is built.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::cache::cache_manager::CacheManagerConfig;
use object_store::path::Path;

use crate::config::{self, Settings, setting_table};
use crate::handle::HandleCache;
use crate::index::IndexCache;
use crate::object::{ObjectId, StoreKey};
use crate::prefetch::FooterWarmup;
use crate::range::RangeCache;
use crate::sql::{Clearing, StatsSource};
use crate::stats::{Activity, LakeStats};
use crate::store::{Caches, datafusion_caches};
use crate::table::{NamesFilesByLog, ScanCaches};

/// The shared state of the crate: one per process, cheap to clone, shared by every session
/// and query. Built with [`LakeCache::builder`].
#[derive(Clone)]
pub struct LakeCache {
    scans: ScanCaches,
}

impl std::fmt::Debug for LakeCache {
    // Not derived: the caches' own `Debug` would print every entry.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LakeCache")
            .field("settings", &self.scans.settings)
            .finish_non_exhaustive()
    }
}

impl AsRef<Caches> for LakeCache {
    fn as_ref(&self) -> &Caches {
        &self.scans.caches
    }
}

impl AsRef<ScanCaches> for LakeCache {
    fn as_ref(&self) -> &ScanCaches {
        &self.scans
    }
}

impl LakeCache {
    /// A builder with every setting at its default.
    pub fn builder() -> LakeCacheBuilder {
        LakeCacheBuilder::default()
    }

    /// The handle cache: object metadata, listings and local file descriptors.
    pub(crate) fn handles(&self) -> &HandleCache {
        &self.scans.caches.handles
    }

    /// The index cache: Parquet footers, page indexes and bloom filters.
    pub(crate) fn index(&self) -> &IndexCache {
        &self.scans.caches.index
    }

    /// The range cache: bytes of remote objects, in memory and on local disk.
    pub(crate) fn ranges(&self) -> &RangeCache {
        &self.scans.caches.ranges
    }

    /// Every setting the caches were built with (and sessions' prefetching defaults).
    pub fn settings(&self) -> &Settings {
        &self.scans.settings
    }

    /// Makes the session built from `builder` use this cache:
    /// - every object store of its runtime is wrapped in a
    ///   [`CachingObjectStore`](crate::CachingObjectStore) (handle and range caching);
    /// - DataFusion's own statistics cache is the session's, checked against the versions the
    ///   handle cache knows; its footer cache is the session's too, and answers a miss from the
    ///   shared index cache for a file that exactly one of the session's stores has recorded
    ///   and proven it can read (a HEAD or GET it answered); DataFusion's listing cache is off,
    ///   since the store wrapper caches listings;
    /// - `CREATE EXTERNAL TABLE ... STORED AS PARQUET` and `register_parquet` give
    ///   [`LakeTable`](crate::LakeTable)s;
    /// - the `lakecache.*` settings are registered: `SET` and `SHOW ALL`;
    /// - every Parquet scan of the final plan reads through the caches and prefetches ahead
    ///   of its readers, within the memory pool of the session that plans it;
    /// - `SELECT * FROM lakecache_stats()` lists every cache's figures (a row per cache) and
    ///   `lakecache_metrics()` every figure (a row per metric); with
    ///   [`LakeCacheBuilder::sql_clear`], `lakecache_clear()` empties the caches (every
    ///   session's: off by default).
    ///
    /// Sessions installed from clones of one `LakeCache` share its caches. Call it after
    /// `with_default_features` (which would replace the table factory) and after setting a
    /// query planner of one's own (which it wraps). A runtime already set on `builder` keeps
    /// its memory pool, disk manager and object stores; its cache manager configuration is
    /// replaced by the one described above, which differs from
    /// [`LakeCache::cache_manager_config`] (for runtimes of one's own) in its footer cache and
    /// in leaving listings to the store wrapper.
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
    pub fn install(&self, builder: SessionStateBuilder) -> Result<SessionStateBuilder> {
        let source: Arc<dyn StatsSource> = Arc::new(self.clone());
        crate::sql::install(builder, &self.scans, source)
    }

    /// DataFusion's cache configuration for a runtime of one's own (a Ballista executor's, a
    /// product's that builds its `RuntimeEnv` by hand): DataFusion's footer and statistics
    /// caches, one of each per configuration, with their entries checked against the
    /// versions the handle cache knows, and listings kept no longer than
    /// the handle cache's listing TTL. DataFusion keys these caches by path alone, with no
    /// store to prove access with, so they are the runtime's own (as in plain DataFusion);
    /// footers, page indexes, bloom filters and bytes are shared by version in the
    /// `LakeCache`, once a store has shown it can read them.
    ///
    /// ```
    /// # use datafusion::execution::runtime_env::RuntimeEnvBuilder;
    /// # use datafusion_lakecache::LakeCache;
    /// let lake = LakeCache::builder().build().unwrap();
    /// let runtime = RuntimeEnvBuilder::new()
    ///     .with_cache_manager(lake.cache_manager_config())
    ///     .build_arc()
    ///     .unwrap();
    /// ```
    pub fn cache_manager_config(&self) -> CacheManagerConfig {
        let list_ttl = self.scans.settings.handle.list_ttl;
        datafusion_caches(
            &self.scans.caches,
            None,
            self.scans.settings.index.datafusion_statistics_bytes,
        )
        .with_list_files_cache_ttl((!list_ttl.is_zero()).then_some(list_ttl))
    }

    /// A snapshot of every cache's figures.
    pub fn stats(&self) -> LakeStats {
        LakeStats {
            handle: self.handles().stats(),
            index: self.index().stats(),
            range: self.ranges().stats(),
            prefetch: self.scans.counters.snapshot(),
            store: self.scans.caches.hedges.snapshot(),
        }
    }

    /// Running totals of what scans read, cheap enough to poll (a progress line): no cache
    /// maintenance, unlike [`LakeCache::stats`].
    pub fn activity(&self) -> Activity {
        let (memory, disk, store) = self.ranges().served();
        Activity {
            footer_lookups: self.index().footer_lookups(),
            bytes_from_memory: memory,
            bytes_from_disk: disk,
            bytes_from_store: store,
            bytes_prefetched: self.scans.counters.bytes_fetched(),
        }
    }

    /// Drops everything cached about one object: its metadata, descriptor, listings that hold
    /// it, and its footer, bloom filters and bytes in every version, for every store.
    /// `store_url` names the store as it was registered (for example `s3://bucket`). Every
    /// object below a prefix: [`LakeCache::invalidate_prefix`]. SQL's `lakecache_invalidate`
    /// drops only what the calling session's stores have shown.
    pub fn invalidate(&self, store_url: &url::Url, path: &Path) {
        self.scans.caches.forget(&ObjectId {
            store: StoreKey::of(store_url),
            path: path.clone(),
        });
    }

    /// Drops everything cached about the objects below `prefix` of the store at `store_url`,
    /// for every store, as [`LakeCache::invalidate`] does for one object, and every listing
    /// at, above or below `prefix`; returns how many objects it dropped. `prefix` matches
    /// whole path segments (`sales` holds `sales/a.parquet` and an object named `sales`, not
    /// `sales2/a.parquet`); an empty prefix is the whole store.
    ///
    /// The objects dropped are those any store has recorded or proved in the handle cache,
    /// and those whose footer or bloom filters are cached. Once it returns, every read below
    /// `prefix` asks the store first: a listing is listed again, and a HEAD, a footer or bytes
    /// are served only after the store answers a HEAD or a GET for that version (bytes the
    /// store shows to be the version the disk tier holds, named by its content, may then come
    /// from disk, as they would for a new store).
    ///
    /// ```
    /// # use datafusion_lakecache::LakeCache;
    /// # use object_store::path::Path;
    /// let lake = LakeCache::builder().build().unwrap();
    /// let url = url::Url::parse("s3://bucket").unwrap();
    /// let dropped = lake.invalidate_prefix(&url, &Path::from("sales/2026"));
    /// assert_eq!(dropped, 0);
    /// ```
    pub fn invalidate_prefix(&self, store_url: &url::Url, prefix: &Path) -> usize {
        let caches = &self.scans.caches;
        let store = StoreKey::of(store_url);
        let mut objects: HashSet<ObjectId> = caches
            .handles
            .objects_under(&store, prefix)
            .into_iter()
            .collect();
        objects.extend(
            caches
                .index
                .bytes_by_version()
                .into_keys()
                .map(|version| version.id().clone())
                .filter(|id| id.store == store && id.path.prefix_match(prefix).is_some()),
        );
        for id in &objects {
            caches.forget(id);
        }
        caches
            .handles
            .invalidate_listings_under(None, &store, prefix);
        objects.len()
    }

    /// Waits until every range written to the disk tier so far is on disk (or failed): before
    /// a process exits, so the next one finds them.
    pub async fn flush(&self) {
        self.ranges().flush().await
    }

    /// Drops every cached entry.
    pub fn clear(&self) {
        self.handles().clear();
        self.index().clear();
        self.ranges().clear();
    }
}

impl StatsSource for LakeCache {
    fn stats(&self) -> LakeStats {
        LakeCache::stats(self)
    }

    fn settings(&self) -> &Settings {
        LakeCache::settings(self)
    }

    fn clear(&self, which: Clearing) {
        match which {
            Clearing::All => LakeCache::clear(self),
            Clearing::Handle => self.handles().clear(),
            Clearing::Index => self.index().clear(),
            Clearing::Range => self.ranges().clear(),
        }
    }
}

/// Builds a [`LakeCache`]; [`LakeCacheBuilder::build`] validates every setting.
#[derive(Debug, Clone, Default)]
pub struct LakeCacheBuilder {
    settings: Settings,
    error: Option<String>,
}

/// Generates a builder method per setting of `setting_table!`.
macro_rules! define_builder {
    ($(
        $(#[$doc:meta])*
        $name:ident $group:ident $title:literal {
            $($field:ident: $ty:ty = $default:expr, $kind:expr, $key:literal, $builder:ident,
              $scope:ident, $desc:literal, $trades:literal;)*
        }
    )*) => {
        impl LakeCacheBuilder {
            $($(
                #[doc = concat!($desc, " (`", $key, "`). Checked by [`LakeCacheBuilder::build`].")]
                pub fn $builder(mut self, value: $ty) -> Self {
                    self.settings.$group.$field = value;
                    self
                }
            )*)*
        }
    };
}

setting_table!(define_builder);

impl LakeCacheBuilder {
    /// Keeps bytes of remote objects on local disk too, in `dir`, up to `bytes`. Entries a
    /// previous process left in `dir` are reused for the same object versions.
    pub fn range_disk(mut self, dir: impl Into<PathBuf>, bytes: u64) -> Self {
        self.settings.range.disk_dir = Some(dir.into());
        self.settings.range.disk_bytes = bytes;
        self
    }

    /// Sets a setting from its `lakecache.*` key and a string value, as SQL `SET` does. A bad
    /// value or an unknown key is reported by [`LakeCacheBuilder::build`].
    pub fn set(mut self, key: &str, value: &str) -> Self {
        if let Err(e) = self.settings.set(key, value)
            && self.error.is_none()
        {
            self.error = Some(message(e));
        }
        self
    }

    /// A builder with the settings the environment gives over the defaults: see
    /// [`LakeCacheBuilder::with_env`].
    pub fn from_env() -> Self {
        Self::default().with_env()
    }

    /// Applies the settings the environment gives, over what this builder has so far (later
    /// calls override them in turn). The variable of a key is `LAKECACHE_` and the key after
    /// `lakecache.`, in upper case with dots as underscores ([`config::variable_of`]):
    /// `LAKECACHE_RANGE_DISK_DIR=/var/cache/lakecache`. A variable of a settings group that
    /// names no setting (`LAKECACHE_HANDLE_CAPACTY`), or a bad value, is reported by
    /// [`LakeCacheBuilder::build`] naming the variable; other `LAKECACHE_*` variables are not
    /// settings and are left alone.
    ///
    /// A library never reads the environment on its own: only an embedder that calls this
    /// does.
    ///
    /// ```
    /// use datafusion_lakecache::LakeCacheBuilder;
    ///
    /// // With LAKECACHE_HANDLE_CAPACITY=50000 in the environment, the handle cache keeps
    /// // 50,000 entries; the builder's own calls after this one override it.
    /// let lake = LakeCacheBuilder::from_env().sql_clear(true).build()?;
    /// # Ok::<(), datafusion::error::DataFusionError>(())
    /// ```
    pub fn with_env(self) -> Self {
        self.with_variables(std::env::vars_os())
    }

    /// [`LakeCacheBuilder::with_env`] over the given variables.
    fn with_variables(
        mut self,
        variables: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
    ) -> Self {
        let groups: Vec<String> = config::SETTINGS
            .iter()
            .filter_map(|s| {
                let group = s.key.strip_prefix("lakecache.")?.split('.').next()?;
                Some(format!(
                    "{}{}_",
                    config::VARIABLE_PREFIX,
                    group.to_ascii_uppercase()
                ))
            })
            .collect();
        let mut found: Vec<(String, std::ffi::OsString)> = variables
            .into_iter()
            .filter_map(|(name, value)| Some((name.into_string().ok()?, value)))
            .filter(|(name, _)| groups.iter().any(|g| name.starts_with(g.as_str())))
            .collect();
        // The environment's order is arbitrary; errors and settings are applied in a fixed one.
        found.sort();
        for (name, value) in found {
            let setting = config::SETTINGS
                .iter()
                .find(|s| config::variable_of(s.key) == name);
            let outcome = match (setting, value.into_string()) {
                (None, _) => Err(format!(
                    "the environment variable {name} names no lakecache setting; the settings' \
                     variables are {}",
                    config::SETTINGS
                        .iter()
                        .map(|s| config::variable_of(s.key))
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
                (Some(_), Err(_)) => Err(format!(
                    "the environment variable {name} is not valid UTF-8"
                )),
                (Some(s), Ok(value)) => self
                    .settings
                    .set(s.key, &value)
                    .map_err(|e| format!("{} (from the environment variable {name})", message(e))),
            };
            if let Err(e) = outcome
                && self.error.is_none()
            {
                self.error = Some(e);
            }
        }
        self
    }

    /// Validates the settings and builds the caches.
    pub fn build(self) -> Result<LakeCache> {
        if let Some(e) = self.error {
            return Err(DataFusionError::Configuration(e));
        }
        let s = self.settings;
        s.validate()?;
        let index = IndexCache::try_new(s.index.clone())?;
        let mut caches = Caches::new(
            HandleCache::try_new(s.handle.clone())?,
            index.clone(),
            RangeCache::try_new(s.range.clone())?,
        )
        .hedging(s.store.hedge);
        if s.index.enabled && s.index.on_listing {
            let warmup = FooterWarmup::new(s.prefetch.clone(), index);
            caches = caches.after_listing(Arc::new(warmup));
        }
        Ok(LakeCache {
            scans: ScanCaches {
                caches,
                settings: Arc::new(s),
                counters: Arc::default(),
                log_formats: log_formats(),
                awaiting: Default::default(),
            },
        })
    }
}

/// The table formats built in whose scans name their files from a log: each registers its
/// hook here.
fn log_formats() -> Arc<[NamesFilesByLog]> {
    let formats: Vec<NamesFilesByLog> = vec![
        #[cfg(feature = "delta")]
        crate::delta::is_delta_scan,
        #[cfg(feature = "iceberg")]
        crate::iceberg::is_iceberg_scan,
    ];
    formats.into()
}

/// The message of a settings error, without DataFusion's "Invalid or Unsupported
/// Configuration" prefix.
fn message(e: DataFusionError) -> String {
    match e {
        DataFusionError::Configuration(m) => m,
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect()
    }

    #[test]
    fn the_environment_sets_keys_by_their_variables_over_earlier_builder_calls() {
        let lake = LakeCache::builder()
            .handle_capacity(7)
            .with_variables(vars(&[
                ("LAKECACHE_HANDLE_CAPACITY", "50_000"),
                ("LAKECACHE_RANGE_MEMORY", "64MiB"),
                ("LAKECACHE_STORE_HEDGE", "off"),
                // Not settings: the tests' own variables are left alone.
                ("LAKECACHE_S3_ENDPOINT", "http://127.0.0.1:1"),
                ("LAKECACHE_FAULT_SEED", "3"),
                ("PATH", "/bin"),
            ]))
            .index_capacity_bytes(1 << 20)
            .build()
            .unwrap();
        let s = lake.settings();
        assert_eq!(s.handle.capacity, 50_000);
        assert_eq!(s.range.memory_bytes, 64 << 20);
        assert!(!s.store.hedge);
        assert_eq!(s.index.capacity_bytes, 1 << 20);
    }

    #[test]
    fn a_misspelt_or_bad_variable_is_refused_naming_it() {
        let err = LakeCacheBuilder::default()
            .with_variables(vars(&[("LAKECACHE_HANDLE_CAPACTY", "5")]))
            .build()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("LAKECACHE_HANDLE_CAPACTY") && err.contains("LAKECACHE_HANDLE_CAPACITY"),
            "{err}"
        );
        let err = LakeCacheBuilder::default()
            .with_variables(vars(&[("LAKECACHE_HANDLE_TTL", "soon")]))
            .build()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("lakecache.handle.ttl") && err.contains("LAKECACHE_HANDLE_TTL"),
            "{err}"
        );
    }

    #[test]
    fn builder_refuses_bad_settings_with_their_name() {
        let err = LakeCache::builder().handle_capacity(0).build().unwrap_err();
        assert!(
            err.to_string().contains("lakecache.handle.capacity"),
            "{err}"
        );
        let err = LakeCache::builder()
            .set("lakecache.handle.ttl", "-1s")
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("lakecache.handle.ttl"), "{err}");
        let err = LakeCache::builder()
            .set("lakecache.nope", "1")
            .build()
            .unwrap_err();
        assert!(
            err.to_string().contains("unknown setting 'lakecache.nope'"),
            "{err}"
        );
        let lake = LakeCache::builder()
            .set("lakecache.handle.ttl", "0")
            .build()
            .unwrap();
        assert_eq!(lake.handles().config().ttl, Duration::ZERO);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn invalidate_prefix_sends_every_read_below_it_to_the_store_and_keeps_the_rest() {
        use crate::CachingObjectStore;
        use crate::testkit::{ContentETags, CountingStore};
        use futures::TryStreamExt;
        use object_store::memory::InMemory;
        use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

        let dir = tempfile::tempdir().unwrap();
        let lake = LakeCache::builder()
            .range_disk(dir.path(), 64 << 20)
            .build()
            .unwrap();
        let url = url::Url::parse("memory://lake").unwrap();
        // Content-named e_tags, as S3's: the bytes go to the disk tier too.
        let counted = Arc::new(CountingStore::new(ContentETags::new(InMemory::new())));
        let store: Arc<dyn ObjectStore> =
            Arc::new(CachingObjectStore::new(Arc::clone(&counted), &url, &lake));
        let below = ["t/a/1", "t/a/2", "t/a/x/3"];
        // `t/ab` shares the prefix's text, not its segments.
        let beside = ["t/b/4", "t/ab/5"];
        for (i, path) in below.iter().chain(&beside).enumerate() {
            let body = format!("object {i} {}", "x".repeat(100 * (i + 1)));
            counted
                .put(&Path::from(*path), PutPayload::from(body.into_bytes()))
                .await
                .unwrap();
        }
        let read = |path: &'static str| {
            let store = Arc::clone(&store);
            async move {
                let path = Path::from(path);
                let size = store.head(&path).await.unwrap().size;
                store.get_range(&path, 0..size).await.unwrap()
            }
        };
        let list = |prefix: &'static str| {
            let store = Arc::clone(&store);
            async move {
                let listed: Vec<_> = store
                    .list(Some(&Path::from(prefix)))
                    .try_collect()
                    .await
                    .unwrap();
                listed.len()
            }
        };
        for _ in 0..2 {
            counted.reset();
            for path in below.iter().chain(&beside) {
                read(path).await;
            }
            assert_eq!(
                (list("t").await, list("t/a/x").await, list("t/b").await),
                (5, 1, 1)
            );
        }
        assert_eq!(
            counted.counts().total(),
            0,
            "warm: nothing reaches the store"
        );
        lake.flush().await;
        assert_eq!(lake.stats().range.disk.entries, 5);

        let dropped = lake.invalidate_prefix(&url, &Path::from("t/a"));
        assert_eq!(dropped, below.len());
        let stats = lake.stats();
        assert_eq!(stats.range.disk.entries, beside.len() as u64);
        assert_eq!(stats.range.memory.entries, beside.len() as u64);

        // Beside the prefix: still served, without a request.
        counted.reset();
        for path in &beside {
            read(path).await;
        }
        assert_eq!(list("t/b").await, 1);
        assert_eq!(counted.counts().total(), 0);
        // Below it (and the listings above it): every read asks the store.
        for path in &below {
            counted.reset();
            read(path).await;
            let asked = counted.counts();
            assert!(asked.head + asked.get >= 1, "{path}: {asked:?}");
        }
        for prefix in ["t", "t/a/x"] {
            counted.reset();
            list(prefix).await;
            assert_eq!(counted.counts().list, 1, "{prefix}");
        }
    }

    #[test]
    fn debug_prints_the_settings_not_the_entries() {
        let lake = LakeCache::builder().build().unwrap();
        let text = format!("{lake:?}");
        assert!(text.starts_with("LakeCache"), "{text}");
        assert!(text.len() < 4096, "{text}");
    }
}
