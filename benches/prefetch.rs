//! The prefetching benchmark: vanilla DataFusion and an installed lakecache session side by
//! side, on a simulated remote store that charges a latency per real request (below range
//! coalescing) and carries every byte over one shared link (`--gbit`, default 1 Gbit/s).
//!
//! - W1: 200 files of 5,000 rows (one row group each): `count(*)`, a filtered sum and a
//!   two-column group-by, cold (a new session, and a new `LakeCache`) and warm, at each
//!   `--latency-ms` (default 25 and 100). The bound printed next to them is
//!   `ceil(requests / max_in_flight) x latency + bytes / bandwidth` of the lakecache run.
//! - W2: 4 files of 2M rows in row groups of 250k: a full scan and a two-column aggregate at
//!   25 ms, against the same queries on the local disk and `bytes / bandwidth`.
//! - Memory: peak RSS of each side over W2's full scan, and the prefetch reservation's peak
//!   against its budget.
//! - Plot: the W1 group-by (warm) at 5 to 100 ms, written as `docs/prefetch-latency.svg`.
//!
//! `cargo bench --bench prefetch` (options: `-- --files N --gbit N --skip-w2 1 --skip-plot 1
//! --only-plot 1`).
//! `LAKECACHE_S3_LATENCY_MS=25 bash scripts/with-s3 cargo bench --bench prefetch -- --s3 1`
//! runs W1 on the S3 server instead, behind a proxy holding each request 25 ms.
//! Each query alternates between the two sides so drift on a shared machine hits both alike.
//! The range cache is off (it would serve warm runs without requests: `benches/range.rs`).

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Series, arg, context, line_plot, ms, peak_rss_mib, reset_peak_rss, run};
use datafusion::error::Result;
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::testkit::lake::{LakeSpec, write_lake};
use datafusion_lakecache::testkit::{CountingStore, LatencyStore, s3_server};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{GetRange, ObjectStore, ObjectStoreExt};
use url::Url;

const WARM_RUNS: usize = 3;

const W1_QUERIES: [(&str, &str); 3] = [
    ("count(*)", "SELECT count(*) FROM t"),
    (
        "filtered sum",
        "SELECT round(sum(value), 3) FROM t WHERE category = 'beta'",
    ),
    (
        "two-column group-by",
        "SELECT category, round(sum(value), 3) FROM t GROUP BY category ORDER BY category",
    ),
];

const W2_QUERIES: [(&str, &str); 2] = [
    ("full scan", "SELECT * FROM t"),
    (
        "two-column aggregate",
        "SELECT category, round(sum(value), 3) FROM t GROUP BY category ORDER BY category",
    ),
];

struct Lake {
    _dir: tempfile::TempDir,
    fs: Arc<LocalFileSystem>,
    table_url: String,
    /// Size of each file, by file name.
    sizes: HashMap<String, u64>,
}

async fn make_lake(spec: &LakeSpec) -> Result<Lake> {
    let dir = tempfile::tempdir()?;
    let fs = Arc::new(LocalFileSystem::new());
    let prefix = Path::from_absolute_path(dir.path().join("lake"))?;
    let paths = write_lake(fs.as_ref(), &prefix, spec).await?;
    let mut sizes = HashMap::new();
    for p in paths {
        let size = fs.head(&p).await?.size;
        sizes.insert(p.filename().unwrap_or_default().to_string(), size);
    }
    let table_url = format!("{}/", dir.path().join("lake").display());
    Ok(Lake {
        _dir: dir,
        fs,
        table_url,
        sizes,
    })
}

type Remote = CountingStore<Arc<dyn ObjectStore>>;

/// Where a lake is served from, as both sides see it.
struct Served {
    /// URL the store is registered under.
    store_url: Url,
    /// The table's URL.
    table_url: String,
    /// A new counted store over the lake, per session.
    store: Box<dyn Fn() -> Arc<Remote>>,
    /// Latency and bandwidth for the bound.
    latency: Duration,
    bandwidth: u64,
}

/// `lake` on the local disk behind a simulated link of `latency` per request and `bandwidth`.
fn simulated(lake: &Lake, latency: Duration, bandwidth: u64) -> Served {
    let fs = Arc::clone(&lake.fs);
    Served {
        store_url: Url::parse("file://").expect("static URL"),
        table_url: lake.table_url.clone(),
        store: Box::new(move || {
            let slow = LatencyStore::new(Arc::clone(&fs), latency).with_bandwidth(bandwidth);
            Arc::new(CountingStore::new(Arc::new(slow) as Arc<dyn ObjectStore>))
        }),
        latency,
        bandwidth,
    }
}

/// A session over `store` where `t` is the lake; installed from `cache` if given.
/// Returns it with the time registration took.
async fn session(
    served: &Served,
    store: Arc<dyn ObjectStore>,
    cache: Option<&LakeCache>,
) -> Result<(SessionContext, Duration)> {
    let ctx = context(cache)?;
    ctx.register_object_store(&served.store_url, store);
    let began = Instant::now();
    ctx.register_parquet("t", &served.table_url, ParquetReadOptions::default())
        .await?;
    Ok((ctx, began.elapsed()))
}

/// Prints each query's warm time with vanilla DataFusion on the local disk: the CPU-bound
/// reference the remote runs are held against.
async fn on_local_disk(lake: &Lake, workload: &str, queries: &[(&str, &str)]) -> Result<()> {
    let disk = simulated(lake, Duration::ZERO, u64::MAX);
    let (local, _) = session(&disk, lake.fs.clone(), None).await?;
    for (name, sql) in queries {
        run(&local, sql).await?;
        let (_, t) = run(&local, sql).await?;
        println!(
            "{workload} {name:<20} local disk (vanilla, warm) {:>7.1} ms",
            ms(t)
        );
    }
    Ok(())
}

/// GETs and bytes the store saw since its last reset.
fn traffic(store: &Remote, sizes: &HashMap<String, u64>) -> (u64, u64) {
    let gets = store.gets();
    let bytes = gets
        .iter()
        .map(|(path, range)| match range {
            Some(GetRange::Bounded(r)) => r.end - r.start,
            _ => path
                .filename()
                .and_then(|f| sizes.get(f))
                .copied()
                .unwrap_or(0),
        })
        .sum();
    (gets.len() as u64, bytes)
}

struct Figures {
    vanilla_register: Duration,
    lake_register: Duration,
    vanilla_cold: Duration,
    lake_cold: Duration,
    vanilla_warm: Duration,
    lake_warm: Duration,
    vanilla_gets: u64,
    lake_gets: u64,
    bound: Duration,
}

/// One query on both sides at one latency: cold (fresh session, fresh LakeCache) and the
/// mean of [`WARM_RUNS`] warm runs.
async fn compare(served: &Served, sizes: &HashMap<String, u64>, sql: &str) -> Result<Figures> {
    let (plain_store, lake_store) = ((served.store)(), (served.store)());
    let (latency, bandwidth) = (served.latency, served.bandwidth);
    let cache = LakeCache::builder().range_cache(false).build()?;
    let max_in_flight = cache.settings().prefetch.max_in_flight as u64;
    let (plain, vanilla_register) = session(served, plain_store.clone(), None).await?;
    let (ours, lake_register) = session(served, lake_store.clone(), Some(&cache)).await?;

    plain_store.reset();
    let (want, vanilla_cold) = run(&plain, sql).await?;
    lake_store.reset();
    let (got, lake_cold) = run(&ours, sql).await?;
    assert_eq!(got, want, "{sql}: both sides return the same rows");

    let (mut vanilla_warm, mut lake_warm) = (Duration::ZERO, Duration::ZERO);
    let (mut vanilla_gets, mut lake_gets, mut bound) = (0, 0, Duration::ZERO);
    for _ in 0..WARM_RUNS {
        plain_store.reset();
        vanilla_warm += run(&plain, sql).await?.1;
        vanilla_gets = traffic(&plain_store, sizes).0;
        lake_store.reset();
        lake_warm += run(&ours, sql).await?.1;
        let (gets, bytes) = traffic(&lake_store, sizes);
        lake_gets = gets;
        bound = latency * gets.div_ceil(max_in_flight) as u32
            + Duration::from_secs_f64(bytes as f64 / bandwidth as f64);
    }
    Ok(Figures {
        vanilla_register,
        lake_register,
        vanilla_cold,
        lake_cold,
        vanilla_warm: vanilla_warm / WARM_RUNS as u32,
        lake_warm: lake_warm / WARM_RUNS as u32,
        vanilla_gets,
        lake_gets,
        bound,
    })
}

fn print(label: &str, f: &Figures) {
    println!(
        "{label:<44} cold {:>8.1} vs {:>7.1} ms ({:>5.1}x)  warm {:>8.1} vs {:>7.1} ms ({:>5.1}x)  \
         GETs {:>4} vs {:>4}  bound {:>6.1} ms ({:.2}x of it)  register {:.0} vs {:.0} ms",
        ms(f.vanilla_cold),
        ms(f.lake_cold),
        ms(f.vanilla_cold) / ms(f.lake_cold),
        ms(f.vanilla_warm),
        ms(f.lake_warm),
        ms(f.vanilla_warm) / ms(f.lake_warm),
        f.vanilla_gets,
        f.lake_gets,
        ms(f.bound),
        ms(f.lake_warm) / ms(f.bound),
        ms(f.vanilla_register),
        ms(f.lake_register),
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let files = arg("--files", 200) as usize;
    let bandwidth = arg("--gbit", 1) * 125_000_000;
    if arg("--s3", 0) == 1 {
        return on_s3_server(files).await;
    }
    let w1 = make_lake(&LakeSpec::small_files(files)).await?;
    println!(
        "W1: {files} files of 5,000 rows, {:.1} MB; link {} Gbit/s; 2 partitions",
        w1.sizes.values().sum::<u64>() as f64 / 1e6,
        bandwidth / 125_000_000
    );
    let w1_queries = W1_QUERIES;
    on_local_disk(&w1, "W1", &w1_queries).await?;
    if arg("--only-plot", 0) == 1 {
        return plot_latencies(&w1, bandwidth).await;
    }
    for latency in [25, 100] {
        let latency = Duration::from_millis(latency);
        for (name, sql) in w1_queries {
            let f = compare(&simulated(&w1, latency, bandwidth), &w1.sizes, sql).await?;
            print(
                &format!("W1 {name} @ {latency:?}: vanilla vs lakecache"),
                &f,
            );
        }
    }
    if arg("--skip-plot", 0) == 0 {
        plot_latencies(&w1, bandwidth).await?;
    }
    drop(w1);

    if arg("--skip-w2", 0) == 0 {
        let spec = LakeSpec::large_files();
        let w2 = make_lake(&spec).await?;
        let total: u64 = w2.sizes.values().sum();
        println!(
            "W2: 4 files of 2M rows in row groups of 250k, {:.1} MB; bytes / bandwidth = {:.1} ms",
            total as f64 / 1e6,
            total as f64 / bandwidth as f64 * 1000.0
        );
        let w2_queries = W2_QUERIES;
        on_local_disk(&w2, "W2", &w2_queries).await?;
        for (name, sql) in w2_queries {
            let served = simulated(&w2, Duration::from_millis(25), bandwidth);
            let f = compare(&served, &w2.sizes, sql).await?;
            print(&format!("W2 {name} @ 25ms: vanilla vs lakecache"), &f);
        }

        // Memory: each side alone, peak RSS over three full scans.
        let sql = w2_queries[0].1;
        let served = simulated(&w2, Duration::from_millis(25), bandwidth);
        let (plain, _) = session(&served, (served.store)(), None).await?;
        reset_peak_rss();
        for _ in 0..3 {
            run(&plain, sql).await?;
        }
        let vanilla_rss = peak_rss_mib();
        let cache = LakeCache::builder().range_cache(false).build()?;
        let (ours, _) = session(&served, (served.store)(), Some(&cache)).await?;
        reset_peak_rss();
        for _ in 0..3 {
            run(&ours, sql).await?;
        }
        let lake_rss = peak_rss_mib();
        let p = cache.stats().prefetch;
        let c = &cache.settings().prefetch;
        println!(
            "W2 full scan peak RSS: vanilla {vanilla_rss:.0} MiB, lakecache {lake_rss:.0} MiB; \
             prefetch reservation peak {:.1} MiB, budget at most {:.1} MiB; {p:?}",
            p.peak_reserved_bytes as f64 / 1048576.0,
            c.budget(c.max_in_flight, u64::MAX, 0) as f64 / 1048576.0
        );
    }
    Ok(())
}

/// W1 (and W2 unless `--skip-w2 1`) on the S3 server `scripts/with-s3` runs, behind its
/// proxy's delay per request (`LAKECACHE_S3_LATENCY_MS`); loopback, so no bandwidth limit
/// enters the bound.
async fn on_s3_server(files: usize) -> Result<()> {
    let Some(server) = s3_server() else {
        eprintln!("--s3 needs the S3 server: LAKECACHE_S3_LATENCY_MS=25 bash scripts/with-s3 ...");
        return Ok(());
    };
    let latency = Duration::from_millis(
        std::env::var("LAKECACHE_S3_LATENCY_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
    );
    let store: Arc<dyn ObjectStore> = Arc::new(server.store);
    let w2 = LakeSpec::large_files();
    let mut workloads = vec![("W1", LakeSpec::small_files(files), &W1_QUERIES[1..])];
    if arg("--skip-w2", 0) == 0 {
        workloads.push(("W2", w2, &W2_QUERIES[..]));
    }
    for (name, spec, queries) in workloads {
        let prefix = Path::from(format!("bench-prefetch-{name}-{}", std::process::id()));
        let paths = write_lake(store.as_ref(), &prefix, &spec).await?;
        let mut sizes = HashMap::new();
        for p in &paths {
            let size = store.head(p).await?.size;
            sizes.insert(p.filename().unwrap_or_default().to_string(), size);
        }
        println!(
            "{name} on the S3 server, {latency:?} per request: {} files, {:.1} MB",
            spec.files,
            sizes.values().sum::<u64>() as f64 / 1e6
        );
        let counted = Arc::clone(&store);
        let served = Served {
            table_url: format!("{}/{prefix}/", server.url.as_str().trim_end_matches('/')),
            store_url: server.url.clone(),
            store: Box::new(move || Arc::new(CountingStore::new(Arc::clone(&counted)))),
            latency,
            bandwidth: u64::MAX,
        };
        for (query, sql) in queries {
            let f = compare(&served, &sizes, sql).await?;
            print(&format!("S3 {name} {query}"), &f);
        }
        for p in &paths {
            store.delete(p).await?;
        }
    }
    Ok(())
}

/// The W1 group-by, warm, at 5 to 100 ms: printed and written as docs/prefetch-latency.svg.
async fn plot_latencies(w1: &Lake, bandwidth: u64) -> Result<()> {
    let sql = W1_QUERIES[2].1;
    let mut points = Vec::new();
    for latency in [5, 10, 25, 50, 100] {
        let served = simulated(w1, Duration::from_millis(latency), bandwidth);
        let f = compare(&served, &w1.sizes, sql).await?;
        println!(
            "plot {latency:>3} ms: vanilla {:>8.1} ms, lakecache {:>7.1} ms, bound {:>6.1} ms",
            ms(f.vanilla_warm),
            ms(f.lake_warm),
            ms(f.bound)
        );
        points.push((latency, f));
    }
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/prefetch-latency.svg");
    std::fs::write(&out, plot(&points))?;
    println!("plot written to {}", out.display());
    Ok(())
}

/// Warm time against latency: vanilla, lakecache and the bound.
fn plot(points: &[(u64, Figures)]) -> String {
    let xs: Vec<u64> = points.iter().map(|p| p.0).collect();
    let values = |f: fn(&Figures) -> Duration| points.iter().map(|p| ms(f(&p.1))).collect();
    line_plot(
        "latency per request (ms)",
        "W1 two-column group-by, warm (ms, log scale)",
        &xs,
        &[
            Series {
                label: "vanilla DataFusion 55.2",
                color: "#c0392b",
                values: values(|f| f.vanilla_warm),
            },
            Series {
                label: "lakecache",
                color: "#2471a3",
                values: values(|f| f.lake_warm),
            },
            Series {
                label: "bound",
                color: "#7f8c8d",
                values: values(|f| f.bound),
            },
        ],
    )
}
