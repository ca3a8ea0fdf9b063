//! `datafusion_lakecache._lakecache`: the lake caches for DataFusion's Python users.
//!
//! Its `LakeCache` (`PyLakeCache`) is one library `LakeCache` (its caches, shared by every
//! table made from it) and a session per store (`store.rs`); its tables cross into
//! datafusion-python as `FFI_TableProvider`s (`__datafusion_table_provider__`).
//! datafusion-python scans a foreign table with its session rebuilt on this side of the
//! boundary over DataFusion's default runtime, which has none of the table's stores and no
//! memory limit: so each table is a `StandaloneTable`, which plans and runs its scans in the
//! installed session of its store (the store of its URL and settings, wrapped by the caches;
//! the one memory pool of `memory_limit`) and on this module's tokio runtime, whose reactor
//! the stores need.

mod store;

/// mimalloc, as datafusion-python's module uses: the scans of this module's tables run on
/// this side of the FFI, and at a million files a warm plan takes 10.1-10.4 s with it
/// against 14.2 s with glibc's (docs/benchmarks.md, "Scale", "The process's allocator").
/// Memory crossing the FFI is released by the side that allocated it (Arrow's C data
/// interface carries its release callback), so two allocators in one process are safe.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock};

use datafusion::catalog::TableProvider;
use datafusion::datasource::listing::ListingTableUrl;
use datafusion::error::DataFusionError;
use datafusion::execution::memory_pool::MemoryPool;
use datafusion::execution::object_store::{DefaultObjectStoreRegistry, ObjectStoreRegistry};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::{SessionState, SessionStateBuilder};
use datafusion_ffi::proto::logical_extension_codec::FFI_LogicalExtensionCodec;
use datafusion_ffi::table_provider::FFI_TableProvider;
use datafusion_lakecache::{LakeCache, LakeTable, StandaloneTable, config};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyTuple};
use store::StoreSettings;

/// The DataFusion this module is built with.
const DATAFUSION_VERSION: &str = "55.2.0";

/// The releases of the `datafusion` package its tables can be registered in: those built
/// with the same datafusion-ffi (55.2.0).
const DATAFUSION_PYTHON: &str = "55.0";

/// The tokio runtime every table of the process plans and streams on.
fn tokio() -> PyResult<&'static tokio::runtime::Runtime> {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    if let Some(runtime) = RUNTIME.get() {
        return Ok(runtime);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .thread_name("lakecache")
        .enable_all()
        .build()
        .map_err(|e| PyRuntimeError::new_err(format!("lakecache: no tokio runtime: {e}")))?;
    Ok(RUNTIME.get_or_init(|| runtime))
}

/// A DataFusion error as a Python exception: a setting's, a `ValueError`; others, a
/// `RuntimeError`, with `what` (the table) in front.
fn error(what: &str, e: DataFusionError) -> PyErr {
    match e {
        DataFusionError::Configuration(m) => PyValueError::new_err(m),
        e => PyRuntimeError::new_err(format!("{what}: {e}")),
    }
}

/// Any other error, with `what` in front.
#[cfg_attr(not(feature = "delta"), allow(dead_code))]
fn failed(what: &str, e: impl std::fmt::Display) -> PyErr {
    PyRuntimeError::new_err(format!("{what}: {e}"))
}

/// The `lakecache.*` key of a keyword: its first `_` is the group's dot
/// (`range_memory` is `lakecache.range.memory`).
fn key_of(keyword: &str) -> String {
    format!("lakecache.{}", keyword.replacen('_', ".", 1))
}

/// A keyword's value as `SET` would spell it.
fn text_of(value: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(flag) = value.extract::<bool>() {
        return Ok(flag.to_string());
    }
    Ok(value.str()?.to_string())
}

/// The stores of a `LakeCache` are told apart by their root URL and what they are made from
/// (their options and the environment's settings).
type StoreId = (String, StoreSettings);

/// `LakeCache(**settings)`: one `LakeCache` and its tables. Make one per process and share
/// it: tables of one cache share its caches, and tables over one store (URL root, options
/// and the environment's settings) share one store identity.
#[pyclass(name = "LakeCache", module = "datafusion_lakecache", frozen)]
struct PyLakeCache {
    lake: LakeCache,
    /// The pool of `memory_limit`, one for every session (every store) of the cache.
    memory_pool: Option<Arc<dyn MemoryPool>>,
    sessions: Mutex<HashMap<StoreId, SessionState>>,
}

#[pymethods]
impl PyLakeCache {
    /// Settings by keyword, as the `lakecache.*` keys with the first dot an underscore
    /// (`range_memory="1GiB"`, `handle_capacity=100000`, `prefetch_max_in_flight=32`);
    /// `range_disk=(dir, size)` keeps bytes on disk too; `memory_limit` bounds the memory pool
    /// every scan of the cache's tables reserves in (prefetched bytes included; unbounded if
    /// not given, the prefetcher then kept by `prefetch_max_bytes`).
    #[new]
    #[pyo3(signature = (*, memory_limit = None, **settings))]
    fn new(
        memory_limit: Option<&Bound<'_, PyAny>>,
        settings: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let mut builder = LakeCache::builder();
        for (keyword, value) in settings.into_iter().flatten() {
            let keyword: String = keyword.extract()?;
            if keyword == "range_disk" {
                let pair = || PyTypeError::new_err("range_disk takes a (directory, size) pair");
                let (dir, size): (String, Bound<'_, PyAny>) = value
                    .cast::<PyTuple>()
                    .map_err(|_| pair())?
                    .extract()
                    .map_err(|_| pair())?;
                builder = builder
                    .set("lakecache.range.disk_dir", &dir)
                    .set("lakecache.range.disk_capacity", &text_of(&size)?);
                continue;
            }
            builder = builder.set(&key_of(&keyword), &text_of(&value)?);
        }
        let lake = builder.build().map_err(|e| error("LakeCache", e))?;
        let memory_pool = match memory_limit {
            None => None,
            Some(limit) => {
                let limit = config::parse_bytes("memory_limit", &text_of(limit)?)
                    .map_err(|e| error("LakeCache", e))?;
                // The pool a session's `memory_limit` makes, made once for every session.
                let limit = usize::try_from(limit).unwrap_or(usize::MAX);
                RuntimeEnvBuilder::new()
                    .with_memory_limit(limit, 1.0)
                    .memory_pool
            }
        };
        Ok(Self {
            lake,
            memory_pool,
            sessions: Mutex::default(),
        })
    }

    /// A table over the Parquet files at `url` (a directory ending in `/`, or a file; a local
    /// path or an `s3://`, `gs://`, `az://`, `http(s)://` URL), read with `storage_options`
    /// (object_store's keys: `aws_region`, `aws_endpoint`, ...) over the environment's
    /// (`AWS_*`, `GOOGLE_*`, `AZURE_*`); a key object_store does not know is a `ValueError`.
    #[pyo3(signature = (url, storage_options = None))]
    fn parquet_table(
        &self,
        py: Python<'_>,
        url: &str,
        storage_options: Option<HashMap<String, String>>,
    ) -> PyResult<PyTable> {
        let what = format!("table {url}");
        let state = self.session(url, storage_options.unwrap_or_default())?;
        let lake = self.lake.clone();
        let (url, planning) = (url.to_string(), state.clone());
        let table = py.detach(|| {
            tokio()?.block_on(async move {
                LakeTable::try_new(&planning, &url, &lake)
                    .await
                    .map_err(|e| error(&what, e))
            })
        })?;
        self.table(Arc::new(table), state)
    }

    /// A Delta Lake table at `url` (a local path, `s3://`, `gs://` or an Azure URL), read
    /// with `storage_options`, at its latest version when loaded (built with the `delta`
    /// feature).
    #[cfg(feature = "delta")]
    #[pyo3(signature = (url, storage_options = None))]
    fn delta_table(
        &self,
        py: Python<'_>,
        url: &str,
        storage_options: Option<HashMap<String, String>>,
    ) -> PyResult<PyTable> {
        let what = format!("Delta table {url}");
        let (state, store, table_url) = self.table_store(url, storage_options, &what)?;
        let lake = self.lake.clone();
        // The module links no deltalake-aws: delta-rs's default log store reads every cloud
        // table (the module only reads).
        datafusion_lakecache::delta::register_default_log_stores();
        let provider = py.detach(|| {
            tokio()?.block_on(async move {
                let table = datafusion_lakecache::delta::table_builder(&lake, &table_url, store)
                    .map_err(|e| failed(&what, e))?
                    .load()
                    .await
                    .map_err(|e| failed(&what, e))?;
                table.table_provider().await.map_err(|e| failed(&what, e))
            })
        })?;
        self.table(provider, state)
    }

    /// An Iceberg table at `url` (its directory, or one of its `*.metadata.json` files; a
    /// local path or an `s3://`, `gs://`, `az://` URL), read with `storage_options`: its
    /// newest snapshot, found again within the listing TTL, or the snapshot `snapshot_id`,
    /// or the one current at `as_of_millis` (built with the `iceberg` feature).
    #[cfg(feature = "iceberg")]
    #[pyo3(signature = (url, storage_options = None, snapshot_id = None, as_of_millis = None))]
    fn iceberg_table(
        &self,
        py: Python<'_>,
        url: &str,
        storage_options: Option<HashMap<String, String>>,
        snapshot_id: Option<i64>,
        as_of_millis: Option<i64>,
    ) -> PyResult<PyTable> {
        use datafusion_lakecache::iceberg::{SnapshotChoice, table_builder};
        let what = format!("Iceberg table {url}");
        let choice = match (snapshot_id, as_of_millis) {
            (Some(_), Some(_)) => {
                return Err(PyValueError::new_err(format!(
                    "{what}: give snapshot_id or as_of_millis, not both"
                )));
            }
            (Some(id), None) => SnapshotChoice::Id(id),
            (None, Some(millis)) => SnapshotChoice::AsOf(millis),
            (None, None) => SnapshotChoice::Latest,
        };
        let (state, store, table_url) = self.table_store(url, storage_options, &what)?;
        let lake = self.lake.clone();
        let table = py.detach(|| {
            tokio()?.block_on(async move {
                table_builder(&lake, &table_url, store)
                    .map_err(|e| error(&what, e))?
                    .snapshot(choice)
                    .load()
                    .await
                    .map_err(|e| error(&what, e))
            })
        })?;
        self.table(Arc::new(table), state)
    }

    /// Every figure of the caches: `{cache: {metric: value}}`, as `lakecache_metrics()`.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let figures = PyDict::new(py);
        for (cache, metric, value) in self.lake.stats().rows() {
            let row = match figures.get_item(cache)? {
                Some(row) => row.cast_into::<PyDict>()?,
                None => {
                    let row = PyDict::new(py);
                    figures.set_item(cache, &row)?;
                    row
                }
            };
            row.set_item(metric, value)?;
        }
        Ok(figures)
    }

    /// Empties every cache.
    fn clear(&self) {
        self.lake.clear();
    }

    /// Waits until every range queued for the disk tier (`range_disk`) so far is written (or
    /// has failed: `stats()["range.disk"]["write_errors"]`), so that the next process to
    /// open the directory finds it. Call it before the process exits: ranges are written in
    /// the background, and nothing flushes them at exit. Returns at once without a disk tier.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let lake = self.lake.clone();
        py.detach(|| {
            tokio()?.block_on(lake.flush());
            Ok(())
        })
    }

    /// Forgets what the caches hold of the object at `url` (a local path or a URL, as
    /// `parquet_table` takes it): its metadata and listings, footer, bloom filters and bytes
    /// (in memory and on disk) in every version, for every store; or, for a URL ending in `/`
    /// (or a local directory), of every object below it, and every listing at, above or below
    /// it. The next read of what was forgotten asks the store (a LIST, HEAD or GET): after
    /// files are rewritten or deleted behind the cache's back, the next query sees them as
    /// they are. A URL that does not parse, or a glob, is a `ValueError` naming it.
    fn invalidate(&self, py: Python<'_>, url: &str) -> PyResult<()> {
        let invalid =
            |e: &dyn std::fmt::Display| PyValueError::new_err(format!("invalidate {url}: {e}"));
        let parsed = ListingTableUrl::parse(url).map_err(|e| invalid(&e))?;
        if parsed.get_glob().is_some() {
            return Err(invalid(&"a glob names no object or prefix to forget"));
        }
        let root = parsed.object_store();
        let store_url: &url::Url = root.as_ref();
        let prefix = parsed.prefix().clone();
        if !parsed.is_collection() && !prefix.as_ref().is_empty() {
            self.lake.invalidate(store_url, &prefix);
            return Ok(());
        }
        let lake = self.lake.clone();
        py.detach(|| lake.invalidate_prefix(store_url, &prefix));
        Ok(())
    }

    /// Drops the stores the cache keeps for its tables to share (one per URL root,
    /// `storage_options` and snapshot of the environment's credential variables: see
    /// `parquet_table`) that no table made from this cache uses any more, with their
    /// sessions and HTTP clients; returns how many it dropped. Call it after credentials
    /// change (a rotated key, new `AWS_*` variables), once the tables made under the old
    /// ones are gone: the cache keeps a store per set of credentials it has seen until then.
    /// A table in use keeps its store. What the caches hold is not dropped: footers and bytes
    /// are shared by every store that shows the same version, and what only a dropped store
    /// had shown (its listings, metadata and proofs of access) is served to no other store
    /// and ages out (`handle_ttl`, 10 minutes by default; `handle_list_ttl` for listings).
    /// The next table over a dropped store's URL and credentials makes a new store, which
    /// lists again and sends one HEAD per file before it is served what the caches hold.
    fn drop_stores(&self) -> usize {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let before = sessions.len();
        // Each table holds its session, and with it the session's runtime, which no other
        // session shares (one is built per store): held by the map alone, no table uses it.
        sessions.retain(|_, state| Arc::strong_count(state.runtime_env()) > 1);
        before - sessions.len()
    }
}

impl PyLakeCache {
    /// The installed session of the store of `url` with `options`, that store (the caches'
    /// wrapper), and the table's URL: what a table format's builder is handed. `what` names
    /// the table in errors.
    #[cfg(any(feature = "delta", feature = "iceberg"))]
    fn table_store(
        &self,
        url: &str,
        options: Option<HashMap<String, String>>,
        what: &str,
    ) -> PyResult<(SessionState, Arc<dyn object_store::ObjectStore>, url::Url)> {
        let state = self.session(url, options.unwrap_or_default())?;
        let parsed = ListingTableUrl::parse(url).map_err(|e| error(what, e))?;
        let store = state
            .runtime_env()
            .object_store(parsed.object_store())
            .map_err(|e| error(what, e))?;
        let table_url = AsRef::<url::Url>::as_ref(&parsed).clone();
        Ok((state, store, table_url))
    }

    /// The installed session of the store of `url` with `options`: made once per store, so
    /// every table over it shares one store identity and what it has shown it can read.
    fn session(&self, url: &str, options: HashMap<String, String>) -> PyResult<SessionState> {
        let what = || format!("table {url}");
        let parsed = ListingTableUrl::parse(url).map_err(|e| error(&what(), e))?;
        let root = parsed.object_store();
        let full: &url::Url = parsed.as_ref();
        let id: StoreId = (root.as_str().to_string(), StoreSettings::of(full, options));
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(state) = sessions.get(&id) {
            return Ok(state.clone());
        }
        let stores = DefaultObjectStoreRegistry::new();
        let made =
            id.1.store(full)
                .map_err(|e| PyValueError::new_err(format!("{}: {e}", what())))?;
        if let Some(made) = made {
            let root_url: &url::Url = root.as_ref();
            stores.register_store(root_url, made);
        }
        let mut runtime = RuntimeEnvBuilder::new().with_object_store_registry(Arc::new(stores));
        if let Some(pool) = &self.memory_pool {
            runtime = runtime.with_memory_pool(Arc::clone(pool));
        }
        let runtime = runtime.build_arc().map_err(|e| error(&what(), e))?;
        let builder = SessionStateBuilder::new()
            .with_default_features()
            .with_runtime_env(runtime);
        let state = self
            .lake
            .install(builder)
            .map_err(|e| error(&what(), e))?
            .build();
        sessions.insert(id, state.clone());
        Ok(state)
    }

    fn table(&self, table: Arc<dyn TableProvider>, state: SessionState) -> PyResult<PyTable> {
        let standalone =
            StandaloneTable::new(table, state, &self.lake).with_tokio(tokio()?.handle().clone());
        Ok(PyTable {
            provider: Arc::new(standalone),
        })
    }
}

/// A table of a `LakeCache`, for `SessionContext.register_table`.
#[pyclass(name = "Table", module = "datafusion_lakecache", frozen)]
struct PyTable {
    provider: Arc<dyn TableProvider>,
}

#[pymethods]
impl PyTable {
    /// The table as datafusion-python takes it: an `FFI_TableProvider` in a capsule, with the
    /// logical codec of the session it is registered in (or the codec capsule itself, as
    /// `Schema.register_table` passes it).
    fn __datafusion_table_provider__<'py>(
        &self,
        py: Python<'py>,
        session: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let codec = logical_codec(session)?;
        let runtime = tokio()?.handle().clone();
        let provider = FFI_TableProvider::new_with_ffi_codec(
            Arc::clone(&self.provider),
            true,
            Some(runtime),
            codec,
        );
        PyCapsule::new_with_value(py, provider, c"datafusion_table_provider")
    }

    fn __repr__(&self) -> String {
        format!("Table({:?})", self.provider)
    }
}

/// The `FFI_LogicalExtensionCodec` of `session` (a datafusion-python `SessionContext`), or
/// `session` itself if it is the codec's capsule.
fn logical_codec(session: &Bound<'_, PyAny>) -> PyResult<FFI_LogicalExtensionCodec> {
    const NAME: &std::ffi::CStr = c"datafusion_logical_extension_codec";
    let capsule = match session.cast::<PyCapsule>() {
        Ok(capsule) => capsule.clone(),
        Err(_) => session
            .call_method0("__datafusion_logical_extension_codec__")?
            .cast_into::<PyCapsule>()?,
    };
    let pointer: NonNull<FFI_LogicalExtensionCodec> = capsule.pointer_checked(Some(NAME))?.cast();
    // SAFETY: a capsule of that name holds an `FFI_LogicalExtensionCodec` (datafusion-python's
    // `__datafusion_logical_extension_codec__`), alive as long as the capsule is; it is
    // cloned through its own vtable before the capsule can go.
    Ok(unsafe { pointer.as_ref() }.clone())
}

/// The seeded lake and the corpus of the Rust tests, for the pytest suite.
#[cfg(feature = "testkit")]
mod testkit {
    use super::*;
    use datafusion_lakecache::testkit::corpus::CORPUS;
    use datafusion_lakecache::testkit::lake::{LakeSpec, write_lake};
    use object_store::path::Path;

    /// `url` parsed, the store of its root made as a table's is, and the path of `url` in it.
    fn root_and_path(
        url: &str,
        options: Option<HashMap<String, String>>,
    ) -> PyResult<(url::Url, Arc<dyn object_store::ObjectStore>, Path)> {
        let invalid = |e: &dyn std::fmt::Display| PyValueError::new_err(format!("{url}: {e}"));
        let parsed = url::Url::parse(url).map_err(|e| invalid(&e))?;
        let (_, path) = object_store::ObjectStoreScheme::parse(&parsed).map_err(|e| invalid(&e))?;
        let store = StoreSettings::of(&parsed, options.unwrap_or_default())
            .store(&parsed)
            .map_err(|e| invalid(&e))?
            .ok_or_else(|| invalid(&"the testkit writes to remote stores only"))?;
        Ok((parsed, store, path))
    }

    /// The differential corpus: queries over a table `t` of the seeded lake.
    #[pyfunction]
    pub(super) fn corpus() -> Vec<&'static str> {
        CORPUS.to_vec()
    }

    /// Writes the seeded small-files lake of `files` files under `url`.
    #[pyfunction]
    #[pyo3(signature = (url, files, storage_options = None))]
    pub(super) fn write_small_files(
        py: Python<'_>,
        url: &str,
        files: usize,
        storage_options: Option<HashMap<String, String>>,
    ) -> PyResult<()> {
        let (_, store, prefix) = root_and_path(url, storage_options)?;
        let spec = LakeSpec::small_files(files);
        py.detach(|| {
            tokio()?.block_on(async move {
                write_lake(store.as_ref(), &prefix, &spec)
                    .await
                    .map(|_| ())
                    .map_err(|e| PyRuntimeError::new_err(format!("{url}: {e}")))
            })
        })
    }

    /// Writes a Delta table of `files` commits of the seeded small-files lake under `url`,
    /// through a log store of its own, not one from delta-rs's registry: the table is then
    /// read with what the module itself registers.
    #[cfg(feature = "delta")]
    #[pyfunction]
    #[pyo3(signature = (url, files, storage_options = None))]
    pub(super) fn write_delta_table(
        py: Python<'_>,
        url: &str,
        files: usize,
        storage_options: Option<HashMap<String, String>>,
    ) -> PyResult<()> {
        use datafusion_lakecache::testkit::delta::delta_batch;
        use deltalake_core::DeltaTable;
        use deltalake_core::logstore::{StorageConfig, default_logstore};
        use deltalake_core::protocol::SaveMode;

        let (table_url, root, _) = root_and_path(url, storage_options)?;
        let config = StorageConfig::default();
        let prefixed = config
            .decorate_store(Arc::clone(&root), &table_url)
            .map_err(|e| failed(url, e))?;
        let log_store = default_logstore(Arc::from(prefixed), root, &table_url, &config);
        let spec = LakeSpec::small_files(files);
        py.detach(|| {
            tokio()?.block_on(async move {
                let mut table = DeltaTable::new(log_store);
                for i in 0..files {
                    table = table
                        .write(vec![delta_batch(&spec, i)])
                        .with_save_mode(SaveMode::Append)
                        .await
                        .map_err(|e| failed(url, e))?;
                }
                Ok(())
            })
        })
    }
}

/// The extension module.
#[pymodule]
fn _lakecache(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyLakeCache>()?;
    m.add_class::<PyTable>()?;
    m.add("DATAFUSION_VERSION", DATAFUSION_VERSION)?;
    m.add("DATAFUSION_PYTHON", DATAFUSION_PYTHON)?;
    #[cfg(feature = "testkit")]
    {
        m.add_function(wrap_pyfunction!(testkit::corpus, m)?)?;
        m.add_function(wrap_pyfunction!(testkit::write_small_files, m)?)?;
        #[cfg(feature = "delta")]
        m.add_function(wrap_pyfunction!(testkit::write_delta_table, m)?)?;
    }
    Ok(())
}
