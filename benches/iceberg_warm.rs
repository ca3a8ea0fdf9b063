//! Warm queries of an Iceberg table of many small files, against the same files read as a
//! folder table, side by side in one session: where an Iceberg scan's time per file goes
//! once every request is cached (planning, the scan's setup, reading). The table is written
//! by the iceberg crate into an in-memory store behind S3's spread of response times (a
//! log-normal body around 25 ms, one in a hundred 20 times longer; the requests of the warm
//! runs are counted: none while the table fits every cache), in `--commits` appends of equal
//! numbers of files of `--rows` rows.
//! The sizes cross the defaults a table meets: DataFusion's statistics cache (20 MiB, about
//! 29,000 such files) at 30,000 files, `lakecache.handle.capacity` (100,000) at 120,000.
//!
//! `cargo bench --bench iceberg_warm --features iceberg` (options:
//! `-- --files 200,2000,30000,120000 --rows 200 --commits 10 --runs 9`; the largest takes
//! minutes a run).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Remote, arg, list, ms, remote_s3_like};
use datafusion::error::Result;
use datafusion::prelude::SessionContext;
use datafusion_lakecache::testkit::iceberg::{IcebergWriter, cities, cities_schema};
use datafusion_lakecache::{CachingObjectStore, LakeCache};
use futures::StreamExt;
use object_store::ObjectStore;
use object_store::memory::InMemory;
use url::Url;

/// The benches' allocator (`bench-mimalloc` chooses mimalloc).
#[global_allocator]
static HEAP: common::CountingHeap = common::CountingHeap;

const QUERIES: [(&str, &str); 2] = [
    (
        "group-by",
        "SELECT city, count(*), sum(value) FROM {t} GROUP BY city",
    ),
    ("count", "SELECT count(*) FROM {t} WHERE value >= 0"),
];

fn external(e: iceberg::Error) -> datafusion::error::DataFusionError {
    datafusion::error::DataFusionError::External(Box::new(e))
}

/// Planning (to a physical plan) and running times of `sql`, and its rows.
async fn timed(ctx: &SessionContext, sql: &str) -> Result<(Duration, Duration, usize)> {
    let began = Instant::now();
    let plan = ctx.sql(sql).await?.create_physical_plan().await?;
    let planned = began.elapsed();
    let mut stream = datafusion::physical_plan::execute_stream(plan, ctx.task_ctx())?;
    let mut rows = 0;
    while let Some(batch) = stream.next().await {
        rows += batch?.num_rows();
    }
    Ok((planned, began.elapsed() - planned, rows))
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    ms(v[v.len() / 2])
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let sizes = list("--files", &[200, 2000, 30_000, 120_000]);
    let rows = arg("--rows", 200) as usize;
    let commits = arg("--commits", 10).max(1) as usize;
    let runs = arg("--runs", 9).max(1) as usize;
    println!(
        "warm queries, median of {runs} (planning + running); an Iceberg table and its data \
         directory as a folder table, one session; allocator: {}",
        common::ALLOCATOR
    );
    println!(
        "| files | query | Iceberg plan + run | folder plan + run | Iceberg / folder | \
         requests per warm run, Iceberg / folder |"
    );
    println!("|---|---|---|---|---|---|");
    for files in sizes {
        let files = files as usize;
        let raw = Arc::new(InMemory::new()) as Arc<dyn ObjectStore>;
        let root = Url::parse("s3://ice").expect("static URL");
        let location = "s3://ice/t";
        let mut writer =
            IcebergWriter::create(Arc::clone(&raw), &root, location, "t", cities_schema())
                .await
                .map_err(external)?;
        let per_commit = files.div_ceil(commits);
        let mut written = 0;
        while written < files {
            let n = per_commit.min(files - written);
            let batches = (written..written + n)
                .map(|i| cities((i * rows) as i64, rows))
                .collect();
            writer.append_files(batches).await.map_err(external)?;
            written += n;
        }

        let store: Arc<Remote> =
            remote_s3_like(Arc::clone(&raw), Duration::from_millis(25), 125_000_000, 7).await?;
        let lake = LakeCache::builder().build()?;
        let ctx = common::context(Some(&lake))?;
        let cached = CachingObjectStore::new_arc(Arc::clone(&store), &root, &lake);
        ctx.register_object_store(&root, Arc::new(cached));
        ctx.sql(&format!(
            "CREATE EXTERNAL TABLE ice STORED AS ICEBERG LOCATION '{location}'"
        ))
        .await?
        .collect()
        .await?;
        ctx.sql(&format!(
            "CREATE EXTERNAL TABLE folder STORED AS PARQUET LOCATION '{location}/data/'"
        ))
        .await?
        .collect()
        .await?;
        for (name, sql) in QUERIES {
            let mut figures = Vec::new();
            for table in ["ice", "folder"] {
                let sql = sql.replace("{t}", table);
                let (mut plans, mut execs) = (Vec::new(), Vec::new());
                let mut answer = None;
                // A first run fills the caches; the requests of the warm runs are counted
                // (none while the table fits every cache; past a capacity, what it costs).
                timed(&ctx, &sql).await?;
                store.reset();
                for _ in 0..runs {
                    let (p, e, n) = timed(&ctx, &sql).await?;
                    plans.push(p);
                    execs.push(e);
                    answer = Some(n);
                }
                assert!(answer.is_some_and(|n| n > 0), "{name} on {table}: no rows");
                let requests = store.counts().total() / runs as u64;
                figures.push((median(plans), median(execs), requests));
            }
            let [(ip, ie, ir), (fp, fe, fr)] = [figures[0], figures[1]];
            println!(
                "| {files} | {name} | {ip:.1} + {ie:.1} ms | {fp:.1} + {fe:.1} ms | {:.2}x | \
                 {ir} / {fr} |",
                (ip + ie) / (fp + fe)
            );
        }
    }
    Ok(())
}
