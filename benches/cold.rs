//! The cold path: a lake this process has never seen, registered and queried once, by
//! vanilla DataFusion and by a new `LakeCache`, side by side. What the link forces is one
//! LIST, the round trips of the pieces the readers read, and their bytes over the link; the
//! figures are each side's time, requests and bytes downloaded, and on the lakecache side
//! the prefetched bytes no reader read (waste).
//!
//! The lake: `LakeSpec::large_files()` (4 files of 2M rows, row groups of 250k, pages of
//! 62.5k rows, `id` sorted) in memory as `s3://lake`, behind `--latency-ms` (default 25) per
//! real request (below range coalescing) and one `--gbit` (default 1) Gbit/s link.
//! `cargo bench --bench cold` (options: `-- --runs N --latency-ms N --gbit N`).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Remote, arg, context, memory_lake, ms, remote, run};
use datafusion::error::Result;
use datafusion::prelude::ParquetReadOptions;
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::testkit::lake::LakeSpec;
use object_store::ObjectStore;
use url::Url;

const QUERIES: [(&str, &str); 4] = [
    (
        "LIKE + LIMIT 10",
        "SELECT id, name, note FROM t WHERE name LIKE '%-0421%' LIMIT 10",
    ),
    (
        "narrow BETWEEN",
        "SELECT count(*), round(sum(value), 3) FROM t WHERE id BETWEEN 4100000 AND 4120000",
    ),
    ("LIMIT 10", "SELECT * FROM t LIMIT 10"),
    (
        "group-by (whole columns)",
        "SELECT category, round(sum(value), 3) FROM t GROUP BY category ORDER BY category",
    ),
];

/// What one cold run cost.
struct Cold {
    took: Duration,
    requests: u64,
    bytes: u64,
    /// Prefetched bytes, and those of them no reader read (lakecache only).
    prefetched: u64,
    wasted: u64,
}

/// Registers the lake in a new session (a new `LakeCache` with `cached`) and runs `sql` once.
async fn cold(store: &Arc<Remote>, cached: bool, sql: &str) -> Result<(usize, Cold)> {
    let lake = LakeCache::builder().build()?;
    let ctx = context(cached.then_some(&lake))?;
    let url = Url::parse("s3://lake").expect("static URL");
    ctx.register_object_store(&url, Arc::clone(store) as Arc<dyn ObjectStore>);
    store.reset();
    let began = Instant::now();
    ctx.register_parquet("t", "s3://lake/lake/", ParquetReadOptions::default())
        .await?;
    let (rows, _) = run(&ctx, sql).await?;
    let took = began.elapsed();
    // Let the scan's downloads wind down before reading the figures.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let p = lake.stats().prefetch;
    if std::env::var("DUMP").is_ok() {
        for g in store.gets() {
            eprintln!("{cached} {g:?}");
        }
    }
    let figures = Cold {
        took,
        requests: store.counts().total(),
        bytes: store.bytes(),
        prefetched: p.bytes_fetched,
        wasted: p.bytes_fetched.saturating_sub(p.bytes_used),
    };
    Ok((rows, figures))
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let runs = arg("--runs", 3) as usize;
    let latency = Duration::from_millis(arg("--latency-ms", 25));
    let bandwidth = arg("--gbit", 1) * 125_000_000;
    let spec = LakeSpec::large_files();
    let (memory, lake_bytes) = memory_lake(&spec).await?;
    let store = remote(memory, latency, bandwidth).await?;
    println!(
        "{} files, {:.1} MiB in all; {} ms per request, one {} Gbit/s link; every run cold \
         (registration + query, a new LakeCache); 2 partitions",
        spec.files,
        mib(lake_bytes),
        latency.as_millis(),
        bandwidth / 125_000_000
    );
    for (name, sql) in QUERIES {
        println!("{name}: {sql}");
        for run_index in 0..runs {
            let (want, vanilla) = cold(&store, false, sql).await?;
            let (got, ours) = cold(&store, true, sql).await?;
            if !name.contains("LIMIT") {
                assert_eq!(got, want, "{sql}: both sides return the same rows");
            }
            println!(
                "  run {}: vanilla {:>7.1} ms {:>3} req {:>6.1} MiB | lakecache {:>7.1} ms {:>3} req \
                 {:>6.1} MiB, prefetched {:>6.1} MiB, waste {:>4.1}% | time {:.2}x, bytes {:.2}x",
                run_index + 1,
                ms(vanilla.took),
                vanilla.requests,
                mib(vanilla.bytes),
                ms(ours.took),
                ours.requests,
                mib(ours.bytes),
                mib(ours.prefetched),
                100.0 * ours.wasted as f64 / ours.prefetched.max(1) as f64,
                ms(ours.took) / ms(vanilla.took),
                ours.bytes as f64 / vanilla.bytes.max(1) as f64,
            );
        }
    }
    Ok(())
}
