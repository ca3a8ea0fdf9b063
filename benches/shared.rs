//! Downloads shared across sessions: 8 sessions of one `LakeCache` running the same cold scan
//! at once, against one session running it alone, with vanilla DataFusion's 8 and 1 beside
//! them. Each session registers the lake (a listing, footers for statistics) and runs the
//! query, as a service answering each query afresh would; a side's figures are its wall time
//! and the requests that reached the store.
//!
//! The lake: `--files` (default 200) files of 5,000 rows in an in-memory store behind 25 ms per
//! real request (below range coalescing) and one shared 1 Gbit/s link, as `s3://lake`.
//! `cargo bench --bench shared` (options: `-- --files N --sessions N --runs N`).

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

const QUERIES: [(&str, &str); 2] = [
    (
        "group-by",
        "SELECT category, round(sum(value), 3) FROM t GROUP BY category",
    ),
    (
        "filter",
        "SELECT id, name FROM t WHERE value > 999.0 AND category = 'beta'",
    ),
];

/// `sessions` sessions at once, each registering the lake and running `sql`; the cache, if
/// given, is one `LakeCache` they all share. Returns the wall time.
async fn at_once(
    sessions: usize,
    lake: Option<&LakeCache>,
    store: &Arc<Remote>,
    sql: &str,
) -> Result<Duration> {
    let url = Url::parse("s3://lake").expect("static URL");
    let began = Instant::now();
    let queries = (0..sessions).map(|_| {
        let (url, store) = (url.clone(), Arc::clone(store) as Arc<dyn ObjectStore>);
        async move {
            let ctx = context(lake)?;
            ctx.register_object_store(&url, store);
            ctx.register_parquet("t", "s3://lake/lake/", ParquetReadOptions::default())
                .await?;
            let (rows, _) = run(&ctx, sql).await?;
            Ok::<usize, datafusion::error::DataFusionError>(rows)
        }
    });
    let rows = futures::future::try_join_all(queries).await?;
    assert!(
        rows.windows(2).all(|w| w[0] == w[1]),
        "every session's rows"
    );
    Ok(began.elapsed())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let files = arg("--files", 200) as usize;
    let sessions = arg("--sessions", 8) as usize;
    let runs = arg("--runs", 3) as usize;
    let (memory, _) = memory_lake(&LakeSpec::small_files(files)).await?;
    let store = remote(memory, Duration::from_millis(25), 125_000_000).await?;
    println!(
        "{files} files of 5000 rows, 25 ms per request, one 1 Gbit/s link; every run cold \
         (a new LakeCache); figures: wall time, requests HEAD/LIST/GET"
    );
    for (name, sql) in QUERIES {
        println!("{name}: {sql}");
        for run_index in 0..runs {
            let mut line = format!("  run {}:", run_index + 1);
            let mut figures = Vec::new();
            for (side, cached) in [("vanilla", false), ("lakecache", true)] {
                for n in [1, sessions] {
                    let lake = LakeCache::builder().build()?;
                    store.reset();
                    let took = at_once(n, cached.then_some(&lake), &store, sql).await?;
                    let c = store.counts();
                    line.push_str(&format!(
                        " {side} x{n} {:>7.1} ms {}/{}/{:<5}|",
                        ms(took),
                        c.head,
                        c.list,
                        c.get
                    ));
                    figures.push((ms(took), c.total()));
                }
            }
            println!("{line}");
            let (one, many) = (figures[2], figures[3]);
            println!(
                "    lakecache x{sessions} against x1: {:.2}x the time, {:.2}x the requests \
                 (vanilla: {:.2}x, {:.2}x)",
                many.0 / one.0,
                many.1 as f64 / one.1 as f64,
                figures[1].0 / figures[0].0,
                figures[1].1 as f64 / figures[0].1 as f64
            );
        }
    }
    Ok(())
}
