//! The range cache benchmark: repeated scans of a remote lake against the same scans on the
//! local disk, with vanilla DataFusion on the same simulated store beside them.
//!
//! The remote store is the lake's directory behind a latency per real request (below range
//! coalescing) and a shared link (`--gbit`, default 1 Gbit/s), registered as `s3://lake` so
//! the range cache applies as it would to S3.
//!
//! - W1: 200 files of 5,000 rows at 25 ms: the two-column group-by, runs 1 to 3 of a new
//!   session on each side, with the GETs of each run; then a new `LakeCache` on the disk tier
//!   the first one filled (a new process with a warm disk), with its requests.
//! - W2: 4 files of 2M rows at 25 ms: full scan and two-column aggregate, runs 1 to 3.
//! - Plot: the W1 group-by's third run at 5 to 100 ms, written as `docs/range-latency.svg`.
//!
//! `cargo bench --bench range` (options: `-- --files N --gbit N --skip-w2 1 --skip-plot 1`).
//! Each run alternates between the sides so drift on a shared machine hits them alike.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Remote, Series, arg, context, line_plot, ms, remote, run};
use datafusion::error::Result;
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::testkit::RequestCounts;
use datafusion_lakecache::testkit::lake::{LakeSpec, write_lake};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use url::Url;

const RUNS: usize = 3;
const GROUP_BY: &str =
    "SELECT category, round(sum(value), 3) FROM t GROUP BY category ORDER BY category";
const W2_QUERIES: [(&str, &str); 2] = [
    ("full scan", "SELECT * FROM t"),
    ("two-column aggregate", GROUP_BY),
];

/// A lake on the local disk.
struct Lake {
    dir: tempfile::TempDir,
    bytes: u64,
}

async fn make_lake(spec: &LakeSpec) -> Result<Lake> {
    let dir = tempfile::tempdir()?;
    let fs = LocalFileSystem::new_with_prefix(dir.path())?;
    let paths = write_lake(&fs, &Path::from("lake"), spec).await?;
    let mut bytes = 0;
    for p in paths {
        bytes += std::fs::metadata(dir.path().join(p.as_ref()))?.len();
    }
    Ok(Lake { dir, bytes })
}

/// The lake behind `latency` per request and `bandwidth`, counted.
async fn remote_lake(lake: &Lake, latency: Duration, bandwidth: u64) -> Result<Arc<Remote>> {
    let fs = LocalFileSystem::new_with_prefix(lake.dir.path())?;
    remote(Arc::new(fs), latency, bandwidth).await
}

/// A session where `t` is the lake: on the local disk if `store` is `None`, else remote
/// through `store`; installed from `cache` if given.
async fn session(
    lake: &Lake,
    store: Option<Arc<Remote>>,
    cache: Option<&LakeCache>,
) -> Result<SessionContext> {
    let ctx = context(cache)?;
    let table = match store {
        Some(store) => {
            let url = Url::parse("s3://lake").expect("static URL");
            ctx.register_object_store(&url, store);
            "s3://lake/lake/".to_string()
        }
        None => format!("{}/", lake.dir.path().join("lake").display()),
    };
    ctx.register_parquet("t", &table, ParquetReadOptions::default())
        .await?;
    Ok(ctx)
}

/// Times and requests of runs 1 to [`RUNS`] of one side.
#[derive(Default)]
struct Runs {
    times: Vec<Duration>,
    gets: Vec<u64>,
    /// Requests of registering the table.
    register: RequestCounts,
}

impl Runs {
    fn show(&self) -> String {
        let runs: Vec<String> = self
            .times
            .iter()
            .zip(&self.gets)
            .map(|(t, g)| format!("{:>7.1} ms {g:>4} GETs", ms(*t)))
            .collect();
        runs.join(" | ")
    }
}

/// Runs `sql` [`RUNS`] times on each side in turn: local disk, vanilla remote, lakecache
/// remote (from `cache`). Checks every side returns the same number of rows.
async fn compare(
    lake: &Lake,
    latency: Duration,
    bandwidth: u64,
    cache: &LakeCache,
    sql: &str,
) -> Result<[Runs; 3]> {
    let plain_store = remote_lake(lake, latency, bandwidth).await?;
    let lake_store = remote_lake(lake, latency, bandwidth).await?;
    let local = session(lake, None, None).await?;
    let plain = session(lake, Some(plain_store.clone()), None).await?;
    let ours = session(lake, Some(lake_store.clone()), Some(cache)).await?;
    let mut sides: [Runs; 3] = Default::default();
    sides[2].register = lake_store.counts();
    sides[1].register = plain_store.counts();
    for _ in 0..RUNS {
        let (want, t) = run(&local, sql).await?;
        sides[0].times.push(t);
        sides[0].gets.push(0);
        for (side, ctx, store) in [(1, &plain, &plain_store), (2, &ours, &lake_store)] {
            store.reset();
            let (rows, t) = run(ctx, sql).await?;
            assert_eq!(rows, want, "{sql}: same rows on every side");
            sides[side].times.push(t);
            sides[side].gets.push(store.counts().get);
        }
    }
    Ok(sides)
}

fn print(label: &str, sides: &[Runs; 3]) {
    let third = |s: &Runs| ms(s.times[RUNS - 1]);
    println!("{label}");
    println!("  local disk (vanilla)  {}", sides[0].show());
    println!("  vanilla @ remote      {}", sides[1].show());
    println!("  lakecache @ remote    {}", sides[2].show());
    println!(
        "  third run: lakecache {:.1} ms = {:.2}x local disk; vanilla {:.1}x slower than lakecache",
        third(&sides[2]),
        third(&sides[2]) / third(&sides[0]),
        third(&sides[1]) / third(&sides[2]),
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let files = arg("--files", 200) as usize;
    let bandwidth = arg("--gbit", 1) * 125_000_000;
    let latency = Duration::from_millis(25);
    let w1 = make_lake(&LakeSpec::small_files(files)).await?;
    println!(
        "W1: {files} files of 5,000 rows, {:.1} MB; {latency:?} per request; link {} Gbit/s; \
         2 partitions",
        w1.bytes as f64 / 1e6,
        bandwidth / 125_000_000
    );
    let disk = tempfile::tempdir()?;
    let with_disk = || {
        LakeCache::builder()
            .range_disk(disk.path(), 4 << 30)
            .build()
    };
    let cache = with_disk()?;
    let sides = compare(&w1, latency, bandwidth, &cache, GROUP_BY).await?;
    print("W1 two-column group-by, runs 1-3", &sides);
    println!(
        "  lakecache CREATE: {:?}; vanilla CREATE: {:?}",
        sides[2].register, sides[1].register
    );
    cache.flush().await;
    println!("  range cache: {:?}", cache.stats().range);
    drop(cache);

    // A new process: a new LakeCache on the disk tier the first one filled.
    let cache = with_disk()?;
    let store = remote_lake(&w1, latency, bandwidth).await?;
    let ctx = session(&w1, Some(store.clone()), Some(&cache)).await?;
    let created = store.counts();
    let local = session(&w1, None, None).await?;
    let mut line = Vec::new();
    for _ in 0..RUNS {
        let (_, local_t) = run(&local, GROUP_BY).await?;
        store.reset();
        let (_, t) = run(&ctx, GROUP_BY).await?;
        line.push(format!(
            "{:.1} ms {} GETs ({:.2}x local {:.1} ms)",
            ms(t),
            store.counts().get,
            ms(t) / ms(local_t),
            ms(local_t)
        ));
    }
    println!("W1 new process, warm disk tier: CREATE {created:?}");
    println!("  runs 1-3: {}", line.join(" | "));
    let r = cache.stats().range;
    println!(
        "  bytes from disk {}, from memory {}, from store {}",
        r.bytes_from_disk, r.bytes_from_memory, r.bytes_from_store
    );
    drop(cache);

    if arg("--skip-plot", 0) == 0 {
        plot_latencies(&w1, bandwidth).await?;
    }
    drop(w1);

    if arg("--skip-w2", 0) == 0 {
        let spec = LakeSpec::large_files();
        let w2 = make_lake(&spec).await?;
        println!(
            "W2: 4 files of 2M rows in row groups of 250k, {:.1} MB; {latency:?}; link {} Gbit/s",
            w2.bytes as f64 / 1e6,
            bandwidth / 125_000_000
        );
        for (name, sql) in W2_QUERIES {
            let cache = LakeCache::builder().build()?;
            let sides = compare(&w2, latency, bandwidth, &cache, sql).await?;
            print(&format!("W2 {name}, runs 1-3"), &sides);
            let r = cache.stats().range;
            println!(
                "  range cache memory {:.1} MiB of {:.0} MiB",
                r.memory_bytes as f64 / 1048576.0,
                r.memory_capacity as f64 / 1048576.0
            );
        }
    }
    Ok(())
}

/// The W1 group-by's third run at 5 to 100 ms: printed and written as docs/range-latency.svg.
async fn plot_latencies(w1: &Lake, bandwidth: u64) -> Result<()> {
    let xs = [5, 10, 25, 50, 100];
    let mut series: Vec<Series> = [
        "local disk (vanilla)",
        "vanilla DataFusion 55.2",
        "lakecache",
    ]
    .into_iter()
    .zip(["#7f8c8d", "#c0392b", "#2471a3"])
    .map(|(label, color)| Series {
        label,
        color,
        values: Vec::new(),
    })
    .collect();
    for latency in xs {
        let cache = LakeCache::builder().build()?;
        let sides = compare(
            w1,
            Duration::from_millis(latency),
            bandwidth,
            &cache,
            GROUP_BY,
        )
        .await?;
        let third: Vec<f64> = sides.iter().map(|s| ms(s.times[RUNS - 1])).collect();
        println!(
            "plot {latency:>3} ms: local {:>6.1} ms, vanilla {:>8.1} ms, lakecache {:>6.1} ms",
            third[0], third[1], third[2]
        );
        for (s, v) in series.iter_mut().zip(third) {
            s.values.push(v);
        }
    }
    let svg = line_plot(
        "latency per request (ms)",
        "W1 two-column group-by, third run (ms, log scale)",
        &xs,
        &series,
    );
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/range-latency.svg");
    std::fs::write(&out, svg)?;
    println!("plot written to {}", out.display());
    Ok(())
}
