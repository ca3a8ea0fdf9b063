//! Affinity placement on a Ballista cluster: plain Ballista, the caches on every executor
//! with Ballista's own placement, and the caches with `AffinityPolicy`, side by side, on 2
//! and 4 executors (2 task slots each) in this process.
//!
//! The lake: `--files` (default 200) files of 5,000 rows behind 25 ms per real request and a
//! 1 Gbit/s link per process, as `s3://bench`. Each executor's memory tier holds what the
//! query reads of the lake (measured first, in one process) divided by 0.75 x the number of
//! executors: the lake is 1.5x one executor's tier on 2 executors and 3x on 4, so only a
//! cluster whose caches add up serves it warm (with a quarter of room for the uneven shares
//! hashing gives). The client's scans read whole files, first one file per partition, then
//! two partitions per task slot (fewer, larger tasks; with affinity, each task's files are
//! grouped by preferred executor), every side at both. Each side runs the
//! query `--runs` (default 5) times in one client session; run 1 is cold, the others warm:
//! their median time, GETs per run, and the executors' memory hit rate over the warm runs.
//!
//! `cargo bench --bench affinity --features ballista` (options: `-- --runs N --files N --wait-ms N`).

mod common;

use std::sync::Arc;
use std::time::Duration;

use ballista::prelude::SessionContextExt;
use common::{Remote, arg, memory_lake, ms, remote, run};
use datafusion::error::Result;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::object_store::{DefaultObjectStoreRegistry, ObjectStoreRegistry};
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::ballista::LakeBallista;
use datafusion_lakecache::testkit::lake::LakeSpec;
use datafusion_lakecache::testkit::{NamedCluster, Placement, Process};
use object_store::ObjectStore;
use url::Url;

const SQL: &str = "SELECT category, count(*), round(sum(value), 3), max(name) FROM t \
                   GROUP BY category ORDER BY category";
const LATENCY: Duration = Duration::from_millis(25);
const BANDWIDTH: u64 = 125_000_000;

/// One side's cluster, the stores its executors reach the lake through, and their caches.
struct Side {
    name: &'static str,
    cluster: NamedCluster,
    stores: Vec<Arc<Remote>>,
    lakes: Vec<LakeCache>,
}

impl Side {
    fn gets(&self) -> u64 {
        self.stores.iter().map(|s| s.counts().get).sum()
    }

    fn reset(&self) {
        self.stores.iter().for_each(|s| s.reset());
    }

    fn memory_lookups(&self) -> (u64, u64) {
        self.lakes.iter().fold((0, 0), |(h, m), l| {
            let s = l.stats().range.memory;
            (h + s.hits, m + s.misses)
        })
    }
}

/// A registry holding the lake as a process's own remote store (its own link).
async fn process_stores(
    lake: &Arc<dyn ObjectStore>,
    url: &Url,
) -> Result<(Arc<dyn ObjectStoreRegistry>, Arc<Remote>)> {
    let counted = remote(Arc::clone(lake), LATENCY, BANDWIDTH).await?;
    let registry = DefaultObjectStoreRegistry::new();
    registry.register_store(url, Arc::clone(&counted) as Arc<dyn ObjectStore>);
    Ok((Arc::new(registry), counted))
}

async fn start(
    name: &'static str,
    cached: bool,
    placement: Placement,
    executors: usize,
    memory: u64,
    lake: &Arc<dyn ObjectStore>,
    url: &Url,
) -> Result<Side> {
    let (registry, _) = process_stores(lake, url).await?;
    let scheduler = match cached {
        true => Process::cached(&LakeBallista::new(LakeCache::builder().build()?, registry)?),
        false => Process::plain(registry)?,
    };
    let cluster = NamedCluster::start(&scheduler, placement).await?;
    let (mut stores, mut lakes) = (Vec::new(), Vec::new());
    for i in 0..executors {
        let (registry, counted) = process_stores(lake, url).await?;
        let process = match cached {
            true => {
                let cache = LakeCache::builder().range_memory_bytes(memory).build()?;
                lakes.push(cache.clone());
                Process::cached(&LakeBallista::new(cache, registry)?)
            }
            false => Process::plain(registry)?,
        };
        cluster
            .add_executor(&format!("executor-{i}"), &process, 2)
            .await?;
        stores.push(counted);
    }
    Ok(Side {
        name,
        cluster,
        stores,
        lakes,
    })
}

/// A client session on `side`'s cluster whose scans read whole files in `partitions`
/// partitions.
async fn client(
    side: &Side,
    lake: &Arc<dyn ObjectStore>,
    url: &Url,
    partitions: usize,
) -> Result<SessionContext> {
    let setup = LakeBallista::new(
        LakeCache::builder().build()?,
        Arc::new(DefaultObjectStoreRegistry::new()),
    )?;
    let mut config = setup.config().with_target_partitions(partitions);
    config.options_mut().optimizer.repartition_file_scans = false;
    let state = SessionStateBuilder::new()
        .with_default_features()
        .with_config(config)
        .build();
    let ctx = SessionContext::remote_with_state(side.cluster.url(), state).await?;
    ctx.register_object_store(url, Arc::clone(lake));
    ctx.register_parquet("t", "s3://bench/lake/", ParquetReadOptions::default())
        .await?;
    Ok(ctx)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let runs = arg("--runs", 5).max(2) as usize;
    let files = arg("--files", 200) as usize;
    let spec = LakeSpec::small_files(files);
    let lake = memory_lake(&spec).await?.0 as Arc<dyn ObjectStore>;
    let url = Url::parse("s3://bench").expect("static URL");

    // What the query reads of the lake, in one process, sizes the executors' memory tiers.
    let probe = LakeCache::builder().build()?;
    let state = probe
        .install(SessionStateBuilder::new().with_default_features())?
        .build();
    let ctx = SessionContext::new_with_state(state);
    ctx.register_object_store(&url, Arc::clone(&lake));
    ctx.register_parquet("t", "s3://bench/lake/", ParquetReadOptions::default())
        .await?;
    run(&ctx, SQL).await?;
    let read = probe.stats().range.memory_bytes;
    println!(
        "{files} files of {} rows; the query reads {:.1} MB; {LATENCY:?} per request, 1 Gbit/s \
         per process; {runs} runs per side, run 1 cold; whole files per partition; {SQL}",
        spec.rows_per_file,
        read as f64 / 1e6,
    );
    let affinity = Placement::Affinity {
        wait: affinity_wait(),
        liveness: Duration::from_secs(60),
    };
    for executors in [2, 4] {
        // The lake is 0.75 x `executors` times one executor's tier: 1.5x on 2, 3x on 4.
        let memory = ((read as f64 / (0.75 * executors as f64)) as u64).max(1 << 20);
        let sides = [
            start(
                "plain Ballista",
                false,
                Placement::Any,
                executors,
                memory,
                &lake,
                &url,
            )
            .await?,
            start(
                "caches, Ballista's placement",
                true,
                Placement::Any,
                executors,
                memory,
                &lake,
                &url,
            )
            .await?,
            start(
                "caches, affinity",
                true,
                affinity,
                executors,
                memory,
                &lake,
                &url,
            )
            .await?,
        ];
        println!(
            "{executors} executors, each with a memory tier of {:.1} MB (the lake {:.1}x one tier):",
            memory as f64 / 1e6,
            read as f64 / memory as f64
        );
        // One whole file per partition, then two partitions per task slot (the affinity
        // policy groups each task's files by preferred executor), each side on the same
        // clusters, whose caches are cleared in between.
        for partitions in [files, executors * 2 * 2] {
            println!("  {partitions} partitions:");
            for side in &sides {
                side.lakes.iter().for_each(|l| l.clear());
                let ctx = client(side, &lake, &url, partitions).await?;
                let placed_before = side.cluster.placement();
                let (mut cold, mut warm, mut gets) = (0.0, Vec::new(), Vec::new());
                let mut lookups = (0, 0);
                for r in 0..runs {
                    side.reset();
                    let before = side.memory_lookups();
                    let (rows, took) = run(&ctx, SQL).await?;
                    assert!(rows > 0);
                    let after = side.memory_lookups();
                    if r == 0 {
                        cold = ms(took);
                    } else {
                        warm.push(ms(took));
                        lookups.0 += after.0 - before.0;
                        lookups.1 += after.1 - before.1;
                    }
                    gets.push(side.gets());
                }
                warm.sort_by(f64::total_cmp);
                let median = warm[warm.len() / 2];
                let rate = match side.lakes.is_empty() {
                    true => "-".to_string(),
                    false => format!(
                        "{:.1}%",
                        100.0 * lookups.0 as f64 / (lookups.0 + lookups.1).max(1) as f64
                    ),
                };
                let placement = side
                    .cluster
                    .placement()
                    .zip(placed_before)
                    .map(|(p, b)| {
                        format!(
                            "; tasks on their preferred executor {}, elsewhere {}",
                            p.preferred - b.preferred,
                            p.elsewhere - b.elsewhere
                        )
                    })
                    .unwrap_or_default();
                println!(
                    "  {:<30} cold {cold:>8.1} ms | warm median {median:>7.1} ms | GETs per run \
                 {gets:?} | memory hit rate (warm) {rate}{placement}",
                    side.name
                );
            }
        }
    }
    Ok(())
}

fn affinity_wait() -> Duration {
    Duration::from_millis(arg("--wait-ms", 100))
}
