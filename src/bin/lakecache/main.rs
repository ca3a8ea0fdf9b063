//! `lakecache`: the command-line tool.
//!
//! `lakecache demo` builds a small lake in a temporary directory, serves it through a
//! simulated remote store that charges a delay per request, and runs the same scans in plain
//! DataFusion sessions and in sessions installed from one `LakeCache`, printing the timings
//! and request counts side by side.

use std::process::ExitCode;
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

const USAGE: &str = "usage: lakecache demo [--files N] [--latency-ms MS] [--runs N]";

struct DemoArgs {
    files: usize,
    latency: Duration,
    runs: usize,
}

fn parse_demo(args: &[String]) -> Result<DemoArgs> {
    let mut out = DemoArgs {
        files: 200,
        latency: Duration::from_millis(25),
        runs: 3,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| {
            DataFusionError::Configuration(format!("{flag} needs a value; {USAGE}"))
        })?;
        let number: u64 = value.parse().map_err(|_| {
            DataFusionError::Configuration(format!("{flag} expects a whole number, got '{value}'"))
        })?;
        match flag.as_str() {
            "--files" if (1..=100_000).contains(&number) => out.files = number as usize,
            "--latency-ms" if number <= 10_000 => out.latency = Duration::from_millis(number),
            "--runs" if (2..=1000).contains(&number) => out.runs = number as usize,
            "--files" | "--latency-ms" | "--runs" => {
                return Err(DataFusionError::Configuration(format!(
                    "{flag} {value} is out of range (--files 1..=100000, --latency-ms 0..=10000, --runs 2..=1000)"
                )));
            }
            _ => {
                return Err(DataFusionError::Configuration(format!(
                    "unknown flag {flag}; {USAGE}"
                )));
            }
        }
    }
    Ok(out)
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

async fn demo(args: DemoArgs) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let fs = Arc::new(LocalFileSystem::new());
    let prefix = Path::from_absolute_path(dir.path().join("lake"))?;
    let spec = LakeSpec::small_files(args.files);
    println!(
        "lakecache demo: {} Parquet files of {} rows in {}, served through a simulated remote store ({} ms per request)",
        spec.files,
        spec.rows_per_file,
        dir.path().display(),
        args.latency.as_millis()
    );
    write_lake(fs.as_ref(), &prefix, &spec).await?;

    let store_url = Url::parse("file://").map_err(|e| DataFusionError::External(e.into()))?;
    let table_url = format!("{}/", dir.path().join("lake").display());
    let remote = || {
        Arc::new(CountingStore::new(LatencyStore::new(
            Arc::clone(&fs),
            args.latency,
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
        args.runs, args.runs
    );
    println!();
    println!(
        "{:<16} {:<11} {:>9} {:>9} {:>22}",
        "query", "store", "cold ms", "warm ms", "last run HEAD/LIST/GET"
    );
    for (name, sql) in SCANS {
        for side in &sides {
            let (cold, warm, counts) = side.run(sql, args.runs).await?;
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

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("demo") => parse_demo(&args[1..]).and_then(|a| {
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
                .block_on(demo(a))
        }),
        Some("-h" | "--help") | None => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Some(other) => Err(DataFusionError::Configuration(format!(
            "unknown command '{other}'; {USAGE}"
        ))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lakecache: {e}");
            ExitCode::FAILURE
        }
    }
}
