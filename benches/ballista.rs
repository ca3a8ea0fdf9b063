//! The Ballista benchmark: repeated queries on a cluster of a scheduler and two executors in
//! this process (each with 2 task slots), over a lake of 100 files of 5,000 rows behind a
//! simulated remote store (25 ms per real request, below range coalescing; a 1 Gbit/s link
//! per process), registered as `s3://bench`. Plain Ballista against the same cluster with
//! the caches (`LakeBallista` in every process), side by side, run by run: each run is a new
//! client session on the long-lived cluster.
//!
//! `cargo bench --bench ballista --features ballista` (options: `-- --runs N --files N`).

mod common;

use std::sync::Arc;
use std::time::Duration;

use ballista::prelude::{SessionConfigExt, SessionContextExt};
use common::{Remote, arg, memory_lake, ms, remote, run};
use datafusion::error::Result;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::object_store::{DefaultObjectStoreRegistry, ObjectStoreRegistry};
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::ballista::LakeBallista;
use datafusion_lakecache::testkit::lake::LakeSpec;
use datafusion_lakecache::testkit::{Process, RequestCounts, start_cluster};
use object_store::ObjectStore;
use url::Url;

const QUERIES: [(&str, &str); 3] = [
    (
        "group-by",
        "SELECT category, count(*), round(sum(value), 3) FROM t GROUP BY category",
    ),
    (
        "filter",
        "SELECT id, name, value FROM t WHERE id BETWEEN 4000 AND 4500",
    ),
    (
        "full scan",
        "SELECT count(*), sum(id), min(name), max(ts), count(note) FROM t",
    ),
];

/// One side: its cluster's URL and the stores its processes reach the lake through.
struct Side {
    url: String,
    stores: Vec<Arc<Remote>>,
}

impl Side {
    fn requests(&self) -> RequestCounts {
        self.stores.iter().map(|s| s.counts()).sum()
    }

    fn reset(&self) {
        self.stores.iter().for_each(|s| s.reset());
    }
}

/// A registry holding the lake as this process's own remote store (its own link).
async fn process_stores(
    lake: &Arc<dyn ObjectStore>,
    url: &Url,
    latency: Duration,
    bandwidth: u64,
) -> Result<(Arc<dyn ObjectStoreRegistry>, Arc<Remote>)> {
    let counted = remote(Arc::clone(lake), latency, bandwidth).await?;
    let registry = DefaultObjectStoreRegistry::new();
    registry.register_store(url, Arc::clone(&counted) as Arc<dyn ObjectStore>);
    Ok((Arc::new(registry), counted))
}

async fn start(
    cached: bool,
    lake: &Arc<dyn ObjectStore>,
    url: &Url,
    latency: Duration,
    bandwidth: u64,
) -> Result<Side> {
    let mut processes = Vec::new();
    let mut stores = Vec::new();
    for _ in 0..3 {
        let (registry, counted) = process_stores(lake, url, latency, bandwidth).await?;
        stores.push(counted);
        processes.push(match cached {
            true => Process::cached(&LakeBallista::new(LakeCache::builder().build()?, registry)?),
            false => Process::plain(registry)?,
        });
    }
    let scheduler = processes.remove(0);
    let url = start_cluster(&scheduler, &processes, 2).await?;
    Ok(Side { url, stores })
}

/// A new client session on the cluster at `url`, with `t` registered (the client reads the
/// schema from a store of its own, outside the figures).
async fn client(
    cluster: &str,
    lake: &Arc<dyn ObjectStore>,
    url: &Url,
    table: &str,
) -> Result<SessionContext> {
    let mut config = SessionConfig::new_with_ballista().with_target_partitions(4);
    // As `LakeBallista::config` has it, and Ballista's docs ask: a task's files are its own.
    config
        .options_mut()
        .execution
        .enable_file_stream_work_stealing = false;
    let state = SessionStateBuilder::new()
        .with_default_features()
        .with_config(config)
        .build();
    let ctx = SessionContext::remote_with_state(cluster, state).await?;
    ctx.register_object_store(url, Arc::clone(lake));
    ctx.register_parquet("t", table, ParquetReadOptions::default())
        .await?;
    Ok(ctx)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let runs = arg("--runs", 4) as usize;
    let files = arg("--files", 100) as usize;
    let latency = Duration::from_millis(25);
    let bandwidth = 125_000_000;
    let spec = LakeSpec::small_files(files);
    let lake = memory_lake(&spec).await?.0 as Arc<dyn ObjectStore>;
    let url = Url::parse("s3://bench").expect("static URL");
    let table = "s3://bench/lake/";
    println!(
        "Ballista: a scheduler and 2 executors (2 slots each); {files} files of {} rows; \
         {latency:?} per request, 1 Gbit/s per process; requests HEAD/LIST/GET over all \
         processes",
        spec.rows_per_file
    );
    let plain = start(false, &lake, &url, latency, bandwidth).await?;
    let ours = start(true, &lake, &url, latency, bandwidth).await?;
    for (name, sql) in QUERIES {
        let mut lines = [String::new(), String::new()];
        let mut times = [Vec::new(), Vec::new()];
        for _ in 0..runs {
            for (i, side) in [&plain, &ours].into_iter().enumerate() {
                let ctx = client(&side.url, &lake, &url, table).await?;
                side.reset();
                let (rows, took) = run(&ctx, sql).await?;
                assert!(rows > 0, "{name}: rows");
                let r = side.requests();
                lines[i].push_str(&format!(
                    " {:>7.1} ms {}/{}/{:<4}|",
                    ms(took),
                    r.head,
                    r.list,
                    r.get
                ));
                times[i].push(ms(took));
            }
        }
        println!("{name}: {sql}");
        println!("  Ballista           {}", lines[0]);
        println!("  Ballista+lakecache {}", lines[1]);
        println!(
            "  first run: {:.2}x, last run: {:.1}x faster with the caches",
            times[0][0] / times[1][0],
            times[0][runs - 1] / times[1][runs - 1]
        );
    }
    Ok(())
}
