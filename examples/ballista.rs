//! A Ballista cluster with the caches: a scheduler and executors, each process with one
//! `LakeCache` (docs/distributed.md).
//!
//! ```text
//! cargo run --example ballista --features ballista                  # all in this process
//! cargo run --example ballista --features ballista -- scheduler 50050
//! cargo run --example ballista --features ballista -- executor localhost:50050 50051 /var/cache/lakecache
//! ```
//!
//! With no argument, a scheduler (placing scan tasks by cache affinity) and two executors run
//! in this process over a generated local lake; a client runs one query twice and prints what
//! each executor's cache served. The second run reads every footer from the executors'
//! caches: the example fails if it does not.
//! A deployment runs `scheduler` once and `executor` on each machine (the third argument, a
//! directory for the disk tier, is optional). Stores beyond local files come from the
//! registry given to `LakeBallista::new`: here `s3://$LAKECACHE_BUCKET`, if set, built from
//! the `AWS_*` environment.

use std::net::SocketAddr;
use std::sync::Arc;

use ballista::prelude::SessionContextExt;
use ballista_executor::executor_process::{ExecutorProcessConfig, start_executor_process};
use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::{SchedulerConfig, TaskDistributionPolicy};
use ballista_scheduler::scheduler_process::start_server;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::object_store::{DefaultObjectStoreRegistry, ObjectStoreRegistry};
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::ballista::{AffinityPolicy, LakeBallista};
use datafusion_lakecache::testkit::lake::{LakeSpec, write_lake};
use datafusion_lakecache::testkit::{NamedCluster, Placement, Process};
use object_store::local::LocalFileSystem;
use object_store::path::Path;

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).map(String::as_str);
    match arg(0) {
        None => in_process().await,
        Some("scheduler") => scheduler(port(arg(1), 50050)?).await,
        Some("executor") => {
            let scheduler = arg(1).unwrap_or("localhost:50050");
            executor(scheduler, port(arg(2), 50051)?, arg(3)).await
        }
        Some(other) => Err(DataFusionError::Configuration(format!(
            "unknown mode {other:?}: scheduler [PORT] | executor [HOST:PORT] [PORT] [DISK_DIR]"
        ))),
    }
}

/// The stores this process reads lakes from: local files, and one S3 bucket if named.
fn stores() -> Result<Arc<dyn ObjectStoreRegistry>> {
    let stores = DefaultObjectStoreRegistry::new();
    if let Ok(bucket) = std::env::var("LAKECACHE_BUCKET") {
        let s3 = object_store::aws::AmazonS3Builder::from_env()
            .with_bucket_name(&bucket)
            .build()?;
        let url = url::Url::parse(&format!("s3://{bucket}"))
            .map_err(|e| DataFusionError::Configuration(format!("LAKECACHE_BUCKET: {e}")))?;
        stores.register_store(&url, Arc::new(s3));
    }
    Ok(Arc::new(stores))
}

async fn scheduler(port: u16) -> Result<()> {
    let setup = LakeBallista::new(LakeCache::builder().build()?, stores()?)?;
    let config = setup.scheduler(SchedulerConfig::default().with_port(port));
    let cluster = BallistaCluster::new_from_config(&config)
        .await
        .map_err(external)?;
    // Scan tasks go to the executor whose caches hold their files (by the executors' names,
    // which each executor sets with its own stable `executor_id`).
    let affinity = Arc::new(AffinityPolicy::new(cluster.cluster_state()));
    // A client's `lakecache_cluster_metrics()` shows its figures, and asks the executors it
    // counts alive for theirs.
    setup.report_placement(&affinity);
    let config = config.with_task_distribution(TaskDistributionPolicy::Custom(affinity));
    let addr = SocketAddr::from(([0, 0, 0, 0], port));
    start_server(cluster, addr, Arc::new(config))
        .await
        .map_err(external)
}

async fn executor(scheduler: &str, port: u16, disk: Option<&str>) -> Result<()> {
    let (host, scheduler_port) = scheduler
        .rsplit_once(':')
        .ok_or_else(|| DataFusionError::Configuration(format!("{scheduler}: want HOST:PORT")))?;
    let mut lake = LakeCache::builder();
    if let Some(dir) = disk {
        lake = lake.range_disk(dir, 100 << 30);
    }
    let setup = LakeBallista::new(lake.build()?, stores()?)?;
    let config = ExecutorProcessConfig {
        // A stable name: the scheduler places tasks by it (affinity), so it must survive
        // restarts, as the disk tier does.
        executor_id: format!("executor-{port}"),
        scheduler_host: host.to_string(),
        scheduler_port: port_number(scheduler_port)?,
        port,
        grpc_port: port + 1,
        ..ExecutorProcessConfig::default()
    };
    start_executor_process(Arc::new(setup.executor(config)))
        .await
        .map_err(external)
}

async fn in_process() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let lake_dir = dir.path().join("lake");
    write_lake(
        &LocalFileSystem::new(),
        &Path::from_absolute_path(&lake_dir)?,
        &LakeSpec::small_files(20),
    )
    .await?;

    // Each process of the cluster has its own LakeCache, as on separate machines. Scan tasks
    // go to the executor whose caches hold their files: a task waits up to 5 s for it.
    let setup = || LakeBallista::new(LakeCache::builder().build()?, stores()?);
    let scheduler = setup()?;
    let placement = Placement::Affinity {
        wait: std::time::Duration::from_secs(5),
        liveness: std::time::Duration::from_secs(10),
    };
    let cluster = NamedCluster::start(&Process::cached(&scheduler), placement).await?;
    let executors = [setup()?, setup()?];
    for (i, executor) in executors.iter().enumerate() {
        let name = format!("executor-{i}");
        cluster
            .add_executor(&name, &Process::cached(executor), 2)
            .await?;
    }
    let url = cluster.url();

    // The client registers the lakecache settings too, so a `SET lakecache.*` reaches the
    // executors. A partition per file: each task's file has one executor it prefers.
    let mut config = setup()?.config().with_target_partitions(20);
    config.options_mut().optimizer.repartition_file_scans = false;
    let state = SessionStateBuilder::new()
        .with_default_features()
        .with_config(config)
        .build();
    let ctx = SessionContext::remote_with_state(url, state).await?;
    let location = format!("{}/", lake_dir.display());
    ctx.register_parquet("t", &location, ParquetReadOptions::default())
        .await?;
    let sql = "SELECT category, count(*) AS n, round(sum(value), 2) AS total FROM t \
               GROUP BY category ORDER BY category";
    let misses = || -> u64 {
        let all = executors
            .iter()
            .map(|e| e.lake().stats().index.footers.misses);
        all.sum()
    };
    let mut before_run = 0;
    for run in 1..=2 {
        before_run = misses();
        let batches = ctx.sql(sql).await?.collect().await?;
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        println!("run {run}: {rows} rows");
        for (i, e) in executors.iter().enumerate() {
            let s = e.lake().stats();
            println!(
                "  executor {i}: footers {} hits / {} misses, descriptors and metadata {} hits, \
                 {} prefetch downloads",
                s.index.footers.hits,
                s.index.footers.misses,
                s.handle.metadata.hits,
                s.prefetch.requests
            );
        }
    }
    let missed = misses() - before_run;
    if missed > 0 {
        return Err(DataFusionError::Execution(format!(
            "the second run read {missed} footers again: the executors' caches did not keep them"
        )));
    }
    println!("the second run read every footer from the executors' caches");
    Ok(())
}

fn port(arg: Option<&str>, default: u16) -> Result<u16> {
    arg.map_or(Ok(default), port_number)
}

fn port_number(text: &str) -> Result<u16> {
    text.parse()
        .map_err(|_| DataFusionError::Configuration(format!("{text:?} is not a port number")))
}

fn external(e: impl std::error::Error + Send + Sync + 'static) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}
