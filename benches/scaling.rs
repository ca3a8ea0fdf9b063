//! Scaling with the machine: the same scan at every `target_partitions` (2, 8, 16), latency
//! per real request (5, 25, 100 ms) and link (1, 10 Gbit/s), vanilla DataFusion against
//! lakecache, cold and warm, side by side in one run.
//!
//! The lake: 64 files of 125k rows in row groups of 62.5k (about 6 MiB each, 381 MiB in
//! all) in memory as `s3://lake`, behind the latency (charged below range coalescing) and one
//! shared link. The query is the two-column group-by, which reads whole column chunks: 193
//! requests cold (a LIST, 64 footers, 128 pieces of chunks). At 10 Gbit/s and 100 ms the
//! link holds 125 MB in flight, more than the whole scan reads.
//!
//! Sides, each a new session over the same simulated store:
//! - **vanilla**: cold (registration + first query), warm (the same session's second query;
//!   DataFusion 55 keeps the footers it read);
//! - **lakecache**: a new `LakeCache`: cold, and warm from its range cache;
//! - **prefetch only**: a `LakeCache` with the range cache off, warm (footers cached, every
//!   data byte downloaded again): the steady state of the prefetcher, where the downloads in
//!   flight decide the time;
//! - **capped at 64**: the same with `lakecache.prefetch.max_in_flight = 64`, a constant cap
//!   on the downloads in flight as the prefetcher had before it sized them from the link.
//!
//! Each figure is the median of `--runs` (default 3), sides interleaved per run. The bounds
//! printed beside them are what the link forces: cold, `bytes / bandwidth + 3 x latency`
//! (LIST, footers, one round of data) over the bytes of the lakecache cold run; warm,
//! `bytes / bandwidth + latency` over the bytes of the prefetch-only warm run.
//! Plots of the cold and prefetch-only times at 10 Gbit/s are written as
//! `docs/scaling-10gbit.svg`, at 1 Gbit/s as `docs/scaling-1gbit.svg`.
//!
//! `cargo bench --bench scaling` (options: `-- --runs N --files N --skip-plot 1`, and
//! `--gbit N --latency-ms N` to run one link only).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Remote, Series, arg, line_plot, memory_lake, ms, remote, run};
use datafusion::error::Result;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use datafusion_lakecache::testkit::lake::LakeSpec;
use datafusion_lakecache::{LakeCache, testkit};
use object_store::ObjectStore;
use url::Url;

const PARTITIONS: [usize; 3] = [2, 8, 16];
const LATENCIES_MS: [u64; 3] = [5, 25, 100];
const GBITS: [u64; 2] = [1, 10];
const GROUP_BY: &str =
    "SELECT category, round(sum(value), 3) FROM t GROUP BY category ORDER BY category";

/// One configuration's times, in ms (medians over the runs), and the lakecache cold run's
/// peak downloads in flight.
#[derive(Default, Clone)]
struct Figures {
    vanilla_cold: f64,
    vanilla_warm: f64,
    cold: f64,
    warm: f64,
    prefetch_warm: f64,
    capped_warm: f64,
    peak_in_flight: u64,
    requests_cold: u64,
    bytes_cold: u64,
    bytes_warm: u64,
}

/// A new session of `partitions` partitions over `store`, with the lake registered as `t`;
/// returns it and how long registration took.
async fn session(
    store: &Arc<Remote>,
    cache: Option<&LakeCache>,
    partitions: usize,
) -> Result<(SessionContext, Duration)> {
    let config = SessionConfig::new().with_target_partitions(partitions);
    let ctx = testkit::context(cache, config)?;
    let url = Url::parse("s3://lake").expect("static URL");
    ctx.register_object_store(&url, Arc::clone(store) as Arc<dyn ObjectStore>);
    let began = Instant::now();
    ctx.register_parquet("t", "s3://lake/lake/", ParquetReadOptions::default())
        .await?;
    Ok((ctx, began.elapsed()))
}

/// Cold (registration + first query) and warm (second query) times of one session, checking
/// the rows against `want` (the first run's).
async fn cold_and_warm(
    store: &Arc<Remote>,
    cache: Option<&LakeCache>,
    partitions: usize,
    want: &mut Option<usize>,
) -> Result<(f64, f64)> {
    let (ctx, registration) = session(store, cache, partitions).await?;
    let (rows, first) = run(&ctx, GROUP_BY).await?;
    let (again, second) = run(&ctx, GROUP_BY).await?;
    let expected = *want.get_or_insert(rows);
    assert_eq!(rows, expected, "every side returns the same rows");
    assert_eq!(again, expected, "every side returns the same rows");
    Ok((ms(registration + first), ms(second)))
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

async fn measure(
    store: &Arc<Remote>,
    partitions: usize,
    runs: usize,
    want: &mut Option<usize>,
) -> Result<Figures> {
    let mut samples: [Vec<f64>; 6] = Default::default();
    let mut figures = Figures::default();
    for _ in 0..runs {
        let (cold, warm) = cold_and_warm(store, None, partitions, want).await?;
        samples[0].push(cold);
        samples[1].push(warm);

        let lake = LakeCache::builder().build()?;
        store.reset();
        let (ctx, registration) = session(store, Some(&lake), partitions).await?;
        let (rows, first) = run(&ctx, GROUP_BY).await?;
        assert_eq!(Some(rows), *want, "every side returns the same rows");
        figures.requests_cold = store.counts().total();
        figures.bytes_cold = store.bytes();
        figures.peak_in_flight = lake.stats().prefetch.peak_in_flight;
        let (_, second) = run(&ctx, GROUP_BY).await?;
        samples[2].push(ms(registration + first));
        samples[3].push(ms(second));

        let prefetch_only = LakeCache::builder().range_cache(false).build()?;
        let (ctx, _) = session(store, Some(&prefetch_only), partitions).await?;
        run(&ctx, GROUP_BY).await?;
        store.reset();
        let (rows, warm) = run(&ctx, GROUP_BY).await?;
        assert_eq!(Some(rows), *want, "every side returns the same rows");
        figures.bytes_warm = store.bytes();
        if std::env::var("DUMP").is_ok() {
            eprintln!("prefetch only, warm: {:?}", prefetch_only.stats().prefetch);
        }
        samples[4].push(ms(warm));

        let capped = LakeCache::builder()
            .range_cache(false)
            .prefetch_max_in_flight(64)
            .build()?;
        let (ctx, _) = session(store, Some(&capped), partitions).await?;
        run(&ctx, GROUP_BY).await?;
        let (rows, warm) = run(&ctx, GROUP_BY).await?;
        assert_eq!(Some(rows), *want, "every side returns the same rows");
        samples[5].push(ms(warm));
    }
    let [vc, vw, c, w, p, capped] = samples.map(median);
    Ok(Figures {
        vanilla_cold: vc,
        vanilla_warm: vw,
        cold: c,
        warm: w,
        prefetch_warm: p,
        capped_warm: capped,
        ..figures
    })
}

const COLORS: [&str; 3] = ["#9ecae1", "#3182bd", "#08306b"];
const OURS: [&str; 3] = ["#fdae6b", "#e6550d", "#7f2704"];
const PREFETCH: [&str; 3] = ["#a1d99b", "#31a354", "#00441b"];

fn plot(gbit: u64, figures: &[(usize, u64, u64, Figures)]) -> String {
    let mut series = Vec::new();
    let labels: Vec<String> = PARTITIONS
        .iter()
        .flat_map(|p| {
            [
                format!("vanilla cold, {p} partitions"),
                format!("lakecache cold, {p} partitions"),
                format!("prefetch only (warm), {p} partitions"),
            ]
        })
        .collect();
    for (i, &p) in PARTITIONS.iter().enumerate() {
        let of = |pick: fn(&Figures) -> f64| -> Vec<f64> {
            LATENCIES_MS
                .iter()
                .map(|&l| {
                    figures
                        .iter()
                        .find(|(fp, fl, fg, _)| *fp == p && *fl == l && *fg == gbit)
                        .map_or(0.0, |(.., f)| pick(f))
                })
                .collect()
        };
        series.push(Series {
            label: &labels[3 * i],
            color: COLORS[i],
            values: of(|f| f.vanilla_cold),
        });
        series.push(Series {
            label: &labels[3 * i + 1],
            color: OURS[i],
            values: of(|f| f.cold),
        });
        series.push(Series {
            label: &labels[3 * i + 2],
            color: PREFETCH[i],
            values: of(|f| f.prefetch_warm),
        });
    }
    line_plot(
        &format!("latency per request (ms), {gbit} Gbit/s"),
        "query time (ms, log)",
        &LATENCIES_MS,
        &series,
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let runs = arg("--runs", 3) as usize;
    let spec = LakeSpec {
        files: arg("--files", 64) as usize,
        rows_per_file: 125_000,
        row_group_rows: 62_500,
        seed: 42,
    };
    let (memory, lake_bytes) = memory_lake(&spec).await?;
    println!(
        "{} files, {:.1} MiB in all; the two-column group-by; medians of {runs} runs (ms)",
        spec.files,
        lake_bytes as f64 / (1 << 20) as f64
    );
    println!(
        "{:>5} {:>4} {:>3} | {:>9} {:>9} | {:>9} {:>9} {:>9} {:>9} | {:>6} {:>6} {:>7} {:>5} \
         | {:>7} {:>7}",
        "Gbit",
        "ms",
        "p",
        "van cold",
        "van warm",
        "ours cold",
        "ours warm",
        "pf warm",
        "cap64",
        "bound",
        "warm b",
        "cold x",
        "peak",
        "pf x",
        "req"
    );
    let mut all = Vec::new();
    let mut want = None;
    let only = |name: &str| arg(name, 0);
    for gbit in GBITS
        .into_iter()
        .filter(|&g| only("--gbit") == 0 || g == only("--gbit"))
    {
        let latencies = LATENCIES_MS.into_iter();
        for latency_ms in
            latencies.filter(|&l| only("--latency-ms") == 0 || l == only("--latency-ms"))
        {
            let bandwidth = gbit * 125_000_000;
            let store = remote(
                memory.clone() as Arc<dyn ObjectStore>,
                Duration::from_millis(latency_ms),
                bandwidth,
            )
            .await?;
            for partitions in PARTITIONS {
                let f = measure(&store, partitions, runs, &mut want).await?;
                let link_ms = |bytes: u64| 1000.0 * bytes as f64 / bandwidth as f64;
                let bound = link_ms(f.bytes_cold) + 3.0 * latency_ms as f64;
                let warm_bound = link_ms(f.bytes_warm) + latency_ms as f64;
                println!(
                    "{gbit:>5} {latency_ms:>4} {partitions:>3} | {:>9.1} {:>9.1} | {:>9.1} {:>9.1} \
                     {:>9.1} {:>9.1} | {bound:>6.1} {warm_bound:>6.1} {:>6.2}x {:>5} | {:>6.2}x \
                     {:>7}",
                    f.vanilla_cold,
                    f.vanilla_warm,
                    f.cold,
                    f.warm,
                    f.prefetch_warm,
                    f.capped_warm,
                    f.vanilla_cold / f.cold,
                    f.peak_in_flight,
                    f.vanilla_warm / f.prefetch_warm,
                    f.requests_cold,
                );
                all.push((partitions, latency_ms, gbit, f));
            }
        }
    }
    println!(
        "cold x: vanilla cold / lakecache cold; pf x: vanilla warm / prefetch-only warm; \
         peak: lakecache cold's peak downloads in flight; req: its requests"
    );
    if arg("--skip-plot", 0) == 0 {
        for gbit in GBITS {
            let path = format!("docs/scaling-{gbit}gbit.svg");
            std::fs::write(&path, plot(gbit, &all))?;
            println!("wrote {path}");
        }
    }
    Ok(())
}
