//! Slow tails and hedged requests: a cold scan of 200 small files on a simulated store whose
//! waits spread as S3's do (`LatencyStore::s3_like`: a log-normal body around the latency,
//! sigma 0.5) where one request in 100 takes 20 times the latency, 50 runs each of vanilla DataFusion,
//! lakecache with `lakecache.store.hedge` off, and lakecache with its defaults (hedging on),
//! interleaved. Figures: the percentiles of the query's time, and the requests that reached
//! the store (hedges included) against those of the run without hedging. Then first contact
//! (registration and the first query, timed together) with the defaults and with hedging off,
//! on the store with its slow tail and on the same store without it (the same log-normal
//! body): the median of each, the ratio of tail to no tail, and the share of requests copied.
//!
//! Each run is a new `LakeCache` and session. Registering the table (a listing and the
//! footers, read with a 64 KiB `metadata_size_hint` on both sides so that files this small are
//! not read whole) is not timed: it gives the hedger its first response times, and a listing,
//! the first request of a process, has none to be hedged by. The scan's reads are cold. The
//! store:
//! `--latency-ms` (default 25) per real request, below range coalescing, with the tail drawn
//! per request from a fixed seed, and one `--gbit` (default 1) Gbit/s link.
//! `cargo bench --bench tail` (options: `-- --runs N --files N --latency-ms N --gbit N`;
//! `--first-contact-only 1` leaves out the cold runs).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Remote, arg, context, memory_lake, percentile, run};
use datafusion::error::Result;
use datafusion::prelude::ParquetReadOptions;
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::testkit::lake::LakeSpec;
use datafusion_lakecache::testkit::{ContentETags, CountingStore, LatencyStore, S3_SIGMA};
use object_store::ObjectStore;
use url::Url;

const SQL: &str = "SELECT category, round(sum(value), 3) FROM t GROUP BY category";

/// The sides, by name and hedging setting (`None`: vanilla DataFusion).
const SIDES: [(&str, Option<bool>); 3] = [
    ("vanilla", None),
    ("lakecache, no hedge", Some(false)),
    ("lakecache, defaults", Some(true)),
];

/// One cold run of `SQL` on a side: its time and the GETs and hedges it made.
async fn cold(store: &Arc<Remote>, hedge: Option<bool>) -> Result<(Duration, u64, u64)> {
    let lake = LakeCache::builder()
        .set(
            "lakecache.store.hedge",
            if hedge == Some(true) { "true" } else { "false" },
        )
        .build()?;
    let ctx = context(hedge.map(|_| &lake))?;
    let url = Url::parse("s3://lake").expect("static URL");
    ctx.register_object_store(&url, Arc::clone(store) as Arc<dyn ObjectStore>);
    ctx.sql("SET datafusion.execution.parquet.metadata_size_hint = 65536")
        .await?;
    ctx.register_parquet("t", "s3://lake/lake/", ParquetReadOptions::default())
        .await?;
    store.reset();
    let hedged = lake.stats().store.hedged;
    let (_, took) = run(&ctx, SQL).await?;
    Ok((took, store.counts().get, lake.stats().store.hedged - hedged))
}

/// One first contact on a side (registration and the first query, timed together); its time,
/// and the GETs and hedges it made.
async fn first_contact(store: &Arc<Remote>, hedge: bool) -> Result<(Duration, u64, u64)> {
    let lake = LakeCache::builder()
        .set(
            "lakecache.store.hedge",
            if hedge { "true" } else { "false" },
        )
        .build()?;
    let ctx = context(Some(&lake))?;
    let url = Url::parse("s3://lake").expect("static URL");
    ctx.register_object_store(&url, Arc::clone(store) as Arc<dyn ObjectStore>);
    store.reset();
    let began = std::time::Instant::now();
    ctx.register_parquet("t", "s3://lake/lake/", ParquetReadOptions::default())
        .await?;
    run(&ctx, SQL).await?;
    let took = began.elapsed();
    Ok((took, store.counts().get, lake.stats().store.hedged))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let runs = arg("--runs", 50) as usize;
    let files = arg("--files", 200) as usize;
    let latency = Duration::from_millis(arg("--latency-ms", 25));
    let bandwidth = arg("--gbit", 1) * 125_000_000;
    let (memory, _) = memory_lake(&LakeSpec::small_files(files)).await?;
    let s3_like = Arc::new(ContentETags::new(memory as Arc<dyn ObjectStore>));
    s3_like.learn(None).await?;
    let slow = LatencyStore::s3_like(Arc::clone(&s3_like) as Arc<dyn ObjectStore>, latency, 7)
        .with_bandwidth(bandwidth);
    let store = Arc::new(CountingStore::new(Arc::new(slow) as Arc<dyn ObjectStore>));
    let even = LatencyStore::new(s3_like as Arc<dyn ObjectStore>, latency)
        .with_spread(S3_SIGMA, 7)
        .with_bandwidth(bandwidth);
    let no_tail = Arc::new(CountingStore::new(Arc::new(even) as Arc<dyn ObjectStore>));
    println!(
        "{files} files of 5,000 rows; {} ms median per request, log-normal (sigma {S3_SIGMA}), \
         1 in 100 taking 20x; one {} Gbit/s link; {runs} cold runs per side, interleaved; \
         query: {SQL}",
        latency.as_millis(),
        bandwidth / 125_000_000
    );
    let mut figures: Vec<(Vec<Duration>, u64, u64)> = vec![(Vec::new(), 0, 0); SIDES.len()];
    let cold_runs = if arg("--first-contact-only", 0) == 1 {
        0
    } else {
        runs
    };
    for _ in 0..cold_runs {
        for (side, (_, hedge)) in SIDES.iter().enumerate() {
            let (took, gets, hedged) = cold(&store, *hedge).await?;
            figures[side].0.push(took);
            figures[side].1 += gets;
            figures[side].2 += hedged;
        }
    }
    if cold_runs > 0 {
        let plain_gets = figures[1].1;
        for ((name, _), (times, gets, hedged)) in SIDES.iter().zip(&figures) {
            println!(
                "{name:<18} p50 {:>7.1} ms  p90 {:>7.1} ms  p99 {:>7.1} ms  max {:>7.1} ms  \
                 GETs {gets:>6} ({:+.1}% against lakecache), hedges {hedged}",
                percentile(times, 50.0),
                percentile(times, 90.0),
                percentile(times, 99.0),
                percentile(times, 100.0),
                100.0 * (*gets as f64 / plain_gets.max(1) as f64 - 1.0),
            );
        }
        println!(
            "p99 without hedging against with it: {:.2}x",
            percentile(&figures[1].0, 99.0) / percentile(&figures[2].0, 99.0)
        );
    }
    println!("first contact (registration + the query), medians of {runs} fresh caches:");
    for (name, hedge) in [("defaults", true), ("no hedge", false)] {
        let (mut tail, mut even) = (Vec::new(), Vec::new());
        let (mut gets, mut hedged) = (0, 0);
        for _ in 0..runs {
            let (took, g, h) = first_contact(&store, hedge).await?;
            tail.push(took);
            (gets, hedged) = (gets + g, hedged + h);
            even.push(first_contact(&no_tail, hedge).await?.0);
        }
        let (t, e) = (percentile(&tail, 50.0), percentile(&even, 50.0));
        println!(
            "  {name:<9} with the tail {t:>7.1} ms, without {e:>7.1} ms: {:.2}x; {hedged} of \
             {gets} GETs copies (1 in {:.0})",
            t / e,
            gets as f64 / hedged.max(1) as f64
        );
    }
    Ok(())
}
