//! `lakecache demo`: builds a small lake in a temporary directory, serves it through a
//! simulated remote store that charges a delay per request, and runs the same scans in plain
//! DataFusion sessions and in sessions installed from one `LakeCache`, printing the timings
//! and request counts side by side.

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::error::{DataFusionError, Result};
use datafusion::prelude::SessionConfig;
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::testkit::lake::{LakeSpec, SCANS, write_lake};
use datafusion_lakecache::testkit::{
    CountingStore, LakeLocation, LatencyStore, RequestCounts, query,
};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use url::Url;

/// What `lakecache demo` runs.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Files in the generated lake.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    files: u64,
    /// Delay of the simulated store per request, in milliseconds.
    #[arg(long = "latency-ms", default_value_t = 25, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    latency_ms: u64,
    /// Runs of each query, each in a new session (the first is the cold one).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(2..=1000))]
    runs: u64,
}

/// One side of the comparison: a store stack and the counter at its bottom.
struct Side {
    name: &'static str,
    location: LakeLocation,
    counts: Arc<CountingStore<LatencyStore<Arc<LocalFileSystem>>>>,
}

impl Side {
    /// Runs `sql` `runs` times, each in a new session; returns the first (cold) time, the
    /// mean of the others (warm) and the requests of the last run.
    async fn run(&self, sql: &str, runs: usize) -> Result<(Duration, Duration, RequestCounts)> {
        let mut times = Vec::with_capacity(runs);
        for _ in 0..runs {
            self.counts.reset();
            let start = Instant::now();
            query(&self.location, sql, SessionConfig::new()).await?;
            times.push(start.elapsed());
        }
        let warm = times[1..].iter().sum::<Duration>() / (runs - 1) as u32;
        Ok((times[0], warm, self.counts.counts()))
    }
}

/// Runs the demo and prints its table.
pub async fn demo(args: DemoArgs) -> Result<()> {
    let (files, runs) = (args.files as usize, args.runs as usize);
    let latency = Duration::from_millis(args.latency_ms);
    let dir = tempfile::tempdir()?;
    let fs = Arc::new(LocalFileSystem::new());
    let prefix = Path::from_absolute_path(dir.path().join("lake"))?;
    let spec = LakeSpec::small_files(files);
    println!(
        "lakecache demo: {} Parquet files of {} rows in {}, served through a simulated remote store ({} ms per request)",
        spec.files,
        spec.rows_per_file,
        dir.path().display(),
        latency.as_millis()
    );
    write_lake(fs.as_ref(), &prefix, &spec).await?;

    let store_url = Url::parse("file://").map_err(|e| DataFusionError::External(e.into()))?;
    let table_url = format!("{}/", dir.path().join("lake").display());
    let remote = || {
        Arc::new(CountingStore::new(LatencyStore::new(
            Arc::clone(&fs),
            latency,
        )))
    };
    let lake = LakeCache::builder().build()?;
    let plain = remote();
    let cached = remote();
    let sides = [
        Side {
            name: "DataFusion",
            location: LakeLocation {
                store_url: store_url.clone(),
                store: plain.clone(),
                table_url: table_url.clone(),
                lake: None,
            },
            counts: plain,
        },
        Side {
            name: "lakecache",
            location: LakeLocation {
                store_url,
                store: cached.clone(),
                table_url,
                lake: Some(lake.clone()),
            },
            counts: cached,
        },
    ];
    println!(
        "each query runs {} times, each time in a new SessionContext; warm = mean of runs 2..{}",
        runs, runs
    );
    println!();
    println!(
        "{:<16} {:<11} {:>9} {:>9} {:>22}",
        "query", "store", "cold ms", "warm ms", "last run HEAD/LIST/GET"
    );
    for (name, sql) in SCANS {
        for side in &sides {
            let (cold, warm, counts) = side.run(sql, runs).await?;
            println!(
                "{:<16} {:<11} {:>9.1} {:>9.1} {:>22}",
                name,
                side.name,
                cold.as_secs_f64() * 1e3,
                warm.as_secs_f64() * 1e3,
                format!("{}/{}/{}", counts.head, counts.list, counts.get)
            );
        }
    }
    let s = lake.stats();
    println!();
    println!(
        "handle cache: metadata {} hits / {} misses, listings {} hits / {} misses",
        s.handles.metadata.hits,
        s.handles.metadata.misses,
        s.handles.listings.hits,
        s.handles.listings.misses
    );
    println!(
        "index cache: {} hits / {} misses, {} entries, {} KiB held",
        s.index.cache.hits,
        s.index.cache.misses,
        s.index.cache.entries,
        s.index.bytes >> 10
    );
    println!(
        "prefetch: {} requests, {} KiB fetched, {} KiB unused, at most {} in flight and {} KiB held",
        s.prefetch.requests,
        s.prefetch.bytes_fetched >> 10,
        s.prefetch.bytes_wasted >> 10,
        s.prefetch.peak_in_flight,
        s.prefetch.peak_reserved_bytes >> 10
    );
    Ok(())
}
