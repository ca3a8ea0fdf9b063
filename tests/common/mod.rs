//! Test fixtures shared by the integration tests: the storage backends every test runs on
//! (a local directory always, the S3 server when `LAKECACHE_S3_ENDPOINT` is set) and a way to
//! run SQL through a fresh `SessionContext` over a given store.
//!
//! Request counting, latency, faults and data generation come from the crate's `testkit`.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::error::Result;
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use datafusion_lakecache::testkit::lake::{LakeSpec, write_lake};
use datafusion_lakecache::testkit::{ContentETags, CountingStore, LakeLocation, query, s3_server};
use datafusion_lakecache::{CachingObjectStore, LakeCache};
use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use url::Url;

/// The store every test counts requests on.
pub type Counted = CountingStore<Arc<dyn ObjectStore>>;
/// The cached store over it.
pub type Cached = CachingObjectStore<Counted>;

/// One place a lake can live.
pub struct Backend {
    /// `local` or `s3`.
    pub name: &'static str,
    /// URL of the store (`file://` or `s3://bucket`).
    pub store_url: Url,
    /// The store itself, without any wrapper.
    pub raw: Arc<dyn ObjectStore>,
    /// The lake's prefix in the store.
    pub prefix: Path,
    local: Option<Arc<LocalFileSystem>>,
    _dir: Option<tempfile::TempDir>,
}

static UNIQUE: AtomicU64 = AtomicU64::new(0);

/// The backends to run a test on: a local directory, and the S3 server if configured.
/// Without `LAKECACHE_S3_ENDPOINT` the S3 part is skipped with a message, except in CI
/// (`CI=true`), where a skipped S3 test fails.
pub fn backends(test: &str) -> Vec<Backend> {
    let mut all = vec![local_backend()];
    all.extend(s3_backend(test));
    all
}

pub fn local_backend() -> Backend {
    let dir = tempfile::tempdir().expect("temp dir");
    let fs = Arc::new(LocalFileSystem::new());
    let prefix = Path::from_absolute_path(dir.path().join("lake")).expect("valid path");
    Backend {
        name: "local",
        store_url: Url::parse("file://").unwrap(),
        raw: fs.clone(),
        prefix,
        local: Some(fs),
        _dir: Some(dir),
    }
}

/// An in-memory store standing for a remote one (`memory://`): its e_tags are digests of the
/// bytes, as S3's are, and it honours `If-Match`, so the range cache (disk tier included)
/// applies to it as to S3.
pub fn memory_backend() -> Backend {
    let store = ContentETags::new(object_store::memory::InMemory::new());
    Backend {
        name: "memory",
        store_url: Url::parse("memory://").unwrap(),
        raw: Arc::new(store),
        prefix: Path::from("lake"),
        local: None,
        _dir: None,
    }
}

/// The remote backends: the in-memory store always, and the S3 server as [`backends`] has it.
pub fn remote_backends(test: &str) -> Vec<Backend> {
    let mut all = vec![memory_backend()];
    all.extend(backends(test).into_iter().filter(|b| b.name != "local"));
    all
}

/// The S3 server's backend for `test`, under a prefix of its own. Without
/// `LAKECACHE_S3_ENDPOINT` it is `None` with a message, except in CI (`CI=true`), where a
/// skipped S3 part fails.
pub fn s3_backend(test: &str) -> Option<Backend> {
    let Some(server) = s3_server() else {
        datafusion_lakecache::testkit::s3_skipped(test);
        return None;
    };
    let unique = format!(
        "{test}-{}-{}",
        std::process::id(),
        UNIQUE.fetch_add(1, Ordering::Relaxed)
    );
    Some(Backend {
        name: "s3",
        store_url: server.url,
        raw: Arc::new(server.store),
        prefix: Path::from(unique),
        local: None,
        _dir: None,
    })
}

impl Backend {
    /// A request-counting store over the raw store.
    pub fn counting(&self) -> Arc<Counted> {
        Arc::new(CountingStore::new(Arc::clone(&self.raw)))
    }

    /// The cached store over `counted`, reading local files through cached descriptors.
    pub fn cached(&self, counted: &Arc<Counted>, lake: &LakeCache) -> Arc<Cached> {
        let store = CachingObjectStore::new_arc(Arc::clone(counted), &self.store_url, lake);
        Arc::new(match &self.local {
            Some(fs) => store.with_local_files(Arc::clone(fs)),
            None => store,
        })
    }

    /// Writes a generated lake under the prefix.
    pub async fn write(&self, spec: &LakeSpec) -> Vec<Path> {
        write_lake(self.raw.as_ref(), &self.prefix, spec)
            .await
            .expect("lake written")
    }

    /// The table location of the lake, as SQL would name it.
    pub fn table_url(&self) -> String {
        format!(
            "{}/{}/",
            self.store_url.as_str().trim_end_matches('/'),
            self.prefix
        )
    }
}

/// Runs `sql` in a new `SessionContext` whose object store for the backend is `store` and
/// where `t` is the lake; returns the result as sorted lines of text.
pub async fn scan(
    backend: &Backend,
    store: Arc<dyn ObjectStore>,
    sql: &str,
) -> Result<Vec<String>> {
    scan_with(backend, store, sql, SessionConfig::new()).await
}

/// [`scan`] with a session configuration.
pub async fn scan_with(
    backend: &Backend,
    store: Arc<dyn ObjectStore>,
    sql: &str,
    config: SessionConfig,
) -> Result<Vec<String>> {
    let lake = LakeLocation {
        store_url: backend.store_url.clone(),
        store,
        table_url: backend.table_url(),
        lake: None,
    };
    sorted_lines(&query(&lake, sql, config).await?)
}

/// Result batches as the lines of their table, sorted, so row order does not matter.
pub fn sorted_lines(batches: &[RecordBatch]) -> Result<Vec<String>> {
    let text = pretty_format_batches(batches)?.to_string();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    lines.sort();
    Ok(lines)
}

/// Runs `sql` in `ctx`; the result as [`sorted_lines`].
pub async fn rows(ctx: &SessionContext, sql: &str) -> Result<Vec<String>> {
    sorted_lines(&ctx.sql(sql).await?.collect().await?)
}

/// A new session installed from `lake` (so its scans prefetch), built from `builder` with
/// `config`, where `t` is the backend's lake read through `store`.
pub async fn installed(
    b: &Backend,
    store: Arc<dyn ObjectStore>,
    lake: &LakeCache,
    builder: SessionStateBuilder,
    config: SessionConfig,
) -> SessionContext {
    let builder = builder.with_default_features().with_config(config);
    let ctx = SessionContext::new_with_state(lake.install(builder).unwrap().build());
    ctx.register_object_store(&b.store_url, store);
    ctx.register_parquet("t", b.table_url(), ParquetReadOptions::default())
        .await
        .unwrap();
    ctx
}

/// The queries of the handle-cache workload: full scan, filtered scan, column pruning.
pub const WORKLOAD: [&str; 3] = [
    "SELECT count(*), sum(id), min(name), max(ts), count(note) FROM t",
    "SELECT id, name, value FROM t WHERE id % 997 = 3 AND category IN ('beta', 'eta') ORDER BY id",
    "SELECT category, count(*), round(sum(value), 3) FROM t GROUP BY category ORDER BY category",
];

/// Prints a figure line of a reliability test and keeps it in
/// `$CARGO_TARGET_TMPDIR/reliability/<name>.txt`, where `.ci/run` collects the figures of
/// the run for `docs/reliability.md`.
pub fn report(name: &str, line: &str) {
    eprintln!("{line}");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("reliability");
    if std::fs::create_dir_all(&dir).is_ok() {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{name}.txt")))
        {
            let _ = writeln!(f, "{line}");
        }
    }
}

/// The figure `name` of each `DataSourceExec` line of an `EXPLAIN ANALYZE`, in order.
pub fn scan_metric(explain: &[String], name: &str) -> Vec<String> {
    explain
        .iter()
        .filter(|line| line.contains("DataSourceExec"))
        .filter_map(|line| {
            // The whole name: after `[` or a space, so `footer_hits` is not `index_footer_hits`.
            let (at, _) = line
                .match_indices(&format!("{name}="))
                .find(|(at, _)| *at > 0 && matches!(line.as_bytes()[at - 1], b' ' | b'['))?;
            let rest = &line[at + name.len() + 1..];
            let end = rest.find([',', ']']).unwrap_or(rest.len());
            Some(rest[..end].to_string())
        })
        .collect()
}

/// What `lake` still holds of queries that ended: prefetch reservations, downloads, leases
/// and index loads, waited for up to 2 s (empty once none is left). A scan counts as over
/// 30 ms after its last reader closed, and aborted tasks go at their next poll, so a check
/// right after a query would race them.
pub async fn leftovers(lake: &LakeCache) -> String {
    let mut last = String::new();
    for _ in 0..200 {
        let p = lake.stats().prefetch;
        let loads = lake.stats().index.loads_in_flight;
        if p.reserved_bytes == 0 && p.in_flight == 0 && p.leases == 0 && loads == 0 {
            return String::new();
        }
        last = format!("{p:?}, {loads} index loads");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    last
}
