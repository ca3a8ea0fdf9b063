//! `lakecache demo`: builds a lake of small Parquet files in a temporary directory and serves
//! it as `s3://demo` through a simulated remote store (a delay per real request, one shared
//! link of limited bandwidth, and the e_tags a real store gives), then runs the same queries
//! in a plain DataFusion session and in a session installed from a `LakeCache`, side by side,
//! with the requests each side made. Each side keeps its one session across its runs, as a
//! datafusion-cli user does, so DataFusion's own footer, statistics and listing caches work
//! for it as they would. It ends with a new `LakeCache` (and session) on the disk tier the
//! first one filled: what a restarted process sees.
//!
//! The store stack is the one `benches/range.rs` measures, so the ratios printed here can be
//! set beside the figures of docs/benchmarks.md.

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::error::{DataFusionError, Result};
use datafusion::prelude::{ParquetReadOptions, SessionConfig};
use datafusion_lakecache::testkit::lake::{LakeSpec, write_lake};
use datafusion_lakecache::testkit::{
    ContentETags, CountingStore, LakeLocation, LatencyStore, RequestCounts, context,
};
use datafusion_lakecache::{LakeCache, LakeStats};
use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use url::Url;

/// The queries, each with the table folder it reads: over many small files, a two-column
/// group-by reading every file and a selective filter; over a few large files (many row
/// groups, where the prefetcher keeps downloads in flight ahead of the readers), a filtered
/// sum.
const QUERIES: [(&str, &str, &str); 3] = [
    (
        "group-by",
        SMALL,
        "SELECT category, round(sum(value), 3) FROM t GROUP BY category ORDER BY category",
    ),
    (
        "filter",
        SMALL,
        "SELECT id, name, value FROM t WHERE id % 997 = 3 AND category IN ('beta', 'eta')",
    ),
    (
        "large files",
        LARGE,
        "SELECT category, count(*), round(sum(value), 3) FROM t WHERE id % 10 < 3 \
         GROUP BY category ORDER BY category",
    ),
];

/// Folders of the two tables in the simulated bucket.
const SMALL: &str = "small";
const LARGE: &str = "large";

/// What `lakecache demo` runs.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Small files in the generated lake (5,000 rows each); the large-files table beside
    /// them has 4 files of 300,000 rows.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    files: u64,
    /// Delay of the simulated store per request, in milliseconds.
    #[arg(long = "latency-ms", default_value_t = 25, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    latency_ms: u64,
    /// Bandwidth of the simulated link, in Gbit/s.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100))]
    gbit: u64,
    /// Runs of each query on each side, in one session per side (the first, which registers
    /// the table, is the cold one).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(2..=1000))]
    runs: u64,
}

type Remote = CountingStore<LatencyStore<ContentETags<LocalFileSystem>>>;

/// The lake and the simulated store in front of it.
struct Setup {
    dir: tempfile::TempDir,
    latency: Duration,
    bandwidth: u64,
    store_url: Url,
}

impl Setup {
    /// A new counted remote store over the lake, with e_tags that are digests of the bytes
    /// as S3's are (learned before anything is timed).
    async fn remote(&self) -> Result<Arc<Remote>> {
        let s3_like = ContentETags::new(LocalFileSystem::new_with_prefix(self.dir.path())?);
        s3_like.learn(None).await?;
        let slow = LatencyStore::new(s3_like, self.latency).with_bandwidth(self.bandwidth);
        Ok(Arc::new(CountingStore::new(slow)))
    }

    fn location(&self, table: &str, store: Arc<Remote>, lake: Option<LakeCache>) -> LakeLocation {
        LakeLocation {
            store_url: self.store_url.clone(),
            store: store as Arc<dyn ObjectStore>,
            table_url: format!("{}{table}/", self.store_url),
            lake,
        }
    }
}

/// Times and requests of each run of one side.
struct Runs {
    times: Vec<Duration>,
    requests: Vec<RequestCounts>,
}

/// Runs `sql` `runs` times in one new session over `location`; the first run registers the
/// table (a listing and the footers), as `CREATE EXTERNAL TABLE` would.
async fn runs(location: &LakeLocation, counts: &Remote, sql: &str, runs: usize) -> Result<Runs> {
    let mut out = Runs {
        times: Vec::new(),
        requests: Vec::new(),
    };
    let ctx = context(location.lake.as_ref(), SessionConfig::new())?;
    ctx.register_object_store(&location.store_url, Arc::clone(&location.store));
    for run in 0..runs {
        counts.reset();
        let start = Instant::now();
        if run == 0 {
            ctx.register_parquet("t", &location.table_url, ParquetReadOptions::default())
                .await?;
        }
        ctx.sql(sql).await?.collect().await?;
        out.times.push(start.elapsed());
        out.requests.push(counts.counts());
    }
    Ok(out)
}

/// Runs the demo and prints its table.
pub async fn demo(args: DemoArgs) -> Result<()> {
    let runs_each = args.runs as usize;
    let small = LakeSpec::small_files(args.files as usize);
    let large = LakeSpec {
        files: 4,
        rows_per_file: 300_000,
        row_group_rows: 50_000,
        seed: 7,
    };
    let setup = Setup {
        dir: tempfile::tempdir()?,
        latency: Duration::from_millis(args.latency_ms),
        bandwidth: args.gbit * 125_000_000,
        store_url: Url::parse("s3://demo/").map_err(|e| DataFusionError::External(e.into()))?,
    };
    let local = LocalFileSystem::new_with_prefix(setup.dir.path())?;
    let mut tables = Vec::new();
    for (folder, spec) in [(SMALL, &small), (LARGE, &large)] {
        let files = write_lake(&local, &Path::from(folder), spec).await?;
        let bytes: u64 = files
            .iter()
            .filter_map(|f| std::fs::metadata(setup.dir.path().join(f.as_ref())).ok())
            .map(|m| m.len())
            .sum();
        tables.push(format!(
            "s3://demo/{folder}/ ({} Parquet files of {} rows, {:.1} MB)",
            spec.files,
            spec.rows_per_file,
            bytes as f64 / 1e6
        ));
    }
    println!(
        "lakecache demo: {} served through a simulated remote store: {} ms per request, one \
         {} Gbit/s link, e_tags as a real store gives them.",
        tables.join(" and "),
        args.latency_ms,
        args.gbit
    );
    println!(
        "Each query runs {runs_each} times per side in one SessionContext per side, kept \
         across its runs as a datafusion-cli user keeps one (DataFusion's own footer, \
         statistics and listing caches on); run 1 registers the table (LIST and footers) and \
         is the cold one. Requests are those that reached the store (HEAD/LIST/GET); \
         target_partitions {} (the cores of this machine).",
        SessionConfig::new().target_partitions(),
    );
    for (name, table, sql) in QUERIES {
        compare(&setup, name, table, sql, runs_each).await?;
    }
    println!();
    println!(
        "The same store stack is measured in release builds by `cargo bench --bench range` \
         (docs/benchmarks.md)."
    );
    Ok(())
}

/// One query: plain DataFusion, a `LakeCache` with a disk tier, and a new `LakeCache` on the
/// disk tier the first one filled.
async fn compare(
    setup: &Setup,
    name: &str,
    table: &str,
    sql: &str,
    runs_each: usize,
) -> Result<()> {
    let disk = tempfile::tempdir_in(setup.dir.path())?;
    let cache = || {
        LakeCache::builder()
            .range_disk(disk.path(), 1 << 30)
            .build()
    };
    let plain_store = setup.remote().await?;
    let plain = runs(
        &setup.location(table, plain_store.clone(), None),
        &plain_store,
        sql,
        runs_each,
    )
    .await?;
    let lake = cache()?;
    let lake_store = setup.remote().await?;
    let cached = runs(
        &setup.location(table, lake_store.clone(), Some(lake.clone())),
        &lake_store,
        sql,
        runs_each,
    )
    .await?;
    let stats = lake.stats();
    // Everything on disk, then the first LakeCache gone, as when a process exits.
    lake.flush().await;
    drop(lake);
    let restarted = cache()?;
    let restarted_store = setup.remote().await?;
    let after_restart = runs(
        &setup.location(table, restarted_store.clone(), Some(restarted.clone())),
        &restarted_store,
        sql,
        1,
    )
    .await?;
    let restarted_stats = restarted.stats();

    println!();
    println!("{name} (s3://demo/{table}/): {sql}");
    let header: String = (1..=runs_each)
        .map(|r| format!("{:>10}", format!("run {r}")))
        .collect();
    println!(
        "  {:<30}{header}   requests of run 1 and run {runs_each}",
        ""
    );
    print_side("DataFusion", &plain);
    print_side("lakecache", &cached);
    print_side("lakecache, restarted on disk", &after_restart);
    let last = |r: &Runs| r.times[r.times.len() - 1].as_secs_f64();
    let first = |r: &Runs| r.times[0].as_secs_f64();
    println!(
        "  speed-up against DataFusion: cold {:.1}x, warm (run {runs_each}) {:.1}x, restarted {:.1}x",
        first(&plain) / first(&cached),
        last(&plain) / last(&cached),
        first(&plain) / first(&after_restart)
    );
    print_capabilities(&stats, &restarted_stats);
    Ok(())
}

fn print_side(name: &str, runs: &Runs) {
    let times: String = runs
        .times
        .iter()
        .map(|t| format!("{:>7.0} ms", t.as_secs_f64() * 1e3))
        .collect();
    let counts = |c: &RequestCounts| format!("{}/{}/{}", c.head, c.list, c.get);
    let requests = match runs.requests.as_slice() {
        [only] => counts(only),
        [first, .., last] => format!("{} → {}", counts(first), counts(last)),
        [] => String::new(),
    };
    // Pad a side with one run to the width of the others.
    let width = 10 * runs.times.len().max(1);
    println!("  {name:<30}{times:<width$}   {requests}");
}

/// What each capability did over the runs of the first `LakeCache`, and where the restarted
/// one found its bytes.
fn print_capabilities(s: &LakeStats, restarted: &LakeStats) {
    let mb = |b: u64| b as f64 / 1e6;
    println!(
        "  handle cache: {} metadata and {} listing lookups answered, {} went to the store",
        s.handle.metadata.hits,
        s.handle.listings.hits,
        s.handle.metadata.misses + s.handle.listings.misses
    );
    println!(
        "  index cache: {} footers from memory, {} decoded ({:.1} MB kept)",
        s.index.footers.hits,
        s.index.footer_loads,
        mb(s.index.bytes)
    );
    println!(
        "  prefetch: {} downloads, up to {} in flight, {:.1} MB, {:.1} MB never read",
        s.prefetch.requests,
        s.prefetch.peak_in_flight,
        mb(s.prefetch.bytes_fetched),
        mb(s.prefetch.bytes_wasted)
    );
    println!(
        "  range cache: readers read {:.1} MB from memory, {:.1} MB from the store; \
         restarted: {:.1} MB from disk, {:.1} MB from the store",
        mb(s.range.bytes_from_memory),
        mb(s.range.bytes_from_store),
        mb(restarted.range.bytes_from_disk),
        mb(restarted.range.bytes_from_store)
    );
}
