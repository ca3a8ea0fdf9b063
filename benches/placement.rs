//! Placement at cluster scale: what `AffinityPolicy` costs Ballista's scheduler to bind a
//! stage of many files over many executors, beside Ballista's own policy (`Bias`) binding
//! the same stage.
//!
//! No executor runs and no file is read: the scheduler's side alone is measured. The cluster
//! is Ballista's in-memory cluster state with `--executors` (default 10,100) executors
//! registered under names, `--slots` (default 2) task slots each. The job is Ballista's own
//! execution graph, planned by its distributed planner from a scan of `--files` (default
//! 20000,200000) files of 1-4 MiB in `--partitions` (default 1000) groups whose output is
//! repartitioned by hash: two stages, the scan's running.
//!
//! The events: the first bind offers every executor's slots (for the policy, the stage's
//! first event: it regroups the files by preferred executor and works out each partition's
//! owner, once per stage attempt); then, until every partition is bound, the next busy
//! executor in turn frees the slots its tasks took and the scheduler binds again, as a
//! finished task's status update does. Reported per side: the first event's time, the
//! median and the slowest of the others, the number of events, and the tasks bound (of them,
//! for the policy, those bound to their preferred executor).
//!
//! `cargo bench --bench placement --features ballista` (options above).

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ballista_core::JobId;
use ballista_core::serde::scheduler::{
    ExecutorData, ExecutorMetadata, ExecutorOperatingSystemSpecification, ExecutorSpecification,
};
use ballista_scheduler::cluster::memory::InMemoryClusterState;
use ballista_scheduler::cluster::{ClusterState, DistributionPolicy};
use ballista_scheduler::config::TaskDistributionPolicy;
use ballista_scheduler::planner::DefaultDistributedPlanner;
use ballista_scheduler::state::execution_graph::{ExecutionGraph, StaticExecutionGraph};
use ballista_scheduler::state::task_manager::JobInfoCache;
use common::{list, ms, percentile};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfigBuilder, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::datasource::table_schema::TableSchema;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::physical_expr::expressions::col;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, Partitioning};
use datafusion::prelude::SessionConfig;
use datafusion_lakecache::ballista::AffinityPolicy;

/// One side's figures for one stage.
struct Binding {
    first: Duration,
    rest: Vec<Duration>,
    tasks: usize,
    /// Of them, bound to their preferred executor (the policy's figure; `None` for Bias).
    preferred: Option<u64>,
}

/// The physical plan of a scan of `files` files in `partitions` groups, repartitioned by hash.
fn plan(files: u64, partitions: u64) -> Result<Arc<dyn ExecutionPlan>> {
    let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
    let mut groups: Vec<Vec<PartitionedFile>> = vec![Vec::new(); partitions as usize];
    for i in 0..files {
        // 1-4 MiB, spread by a multiplicative hash so that neighbours differ.
        let size = (1 << 20) + (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 42);
        let file = PartitionedFile::new(format!("lake/t/part-{i:07}.parquet"), size);
        groups[(i % partitions) as usize].push(file);
    }
    let source = ParquetSource::new(TableSchema::from(Arc::clone(&schema)));
    let config = FileScanConfigBuilder::new(ObjectStoreUrl::parse("s3://lake")?, Arc::new(source))
        .with_file_groups(groups.into_iter().map(FileGroup::new).collect())
        .build();
    let scan = DataSourceExec::from_data_source(config);
    let hashed = RepartitionExec::try_new(scan, Partitioning::Hash(vec![col("v", &schema)?], 16))?;
    Ok(Arc::new(CoalescePartitionsExec::new(Arc::new(hashed))))
}

/// Ballista's in-memory cluster state with `n` executors of `slots` slots registered.
async fn cluster(n: u64, slots: u32) -> Result<Arc<InMemoryClusterState>> {
    let cluster = Arc::new(InMemoryClusterState::default());
    for i in 0..n {
        let id = format!("executor-{i:03}");
        let metadata = ExecutorMetadata {
            id: id.clone(),
            host: format!("10.0.{}.{}", i / 250, i % 250),
            port: 50051,
            grpc_port: 50052,
            specification: ExecutorSpecification { vcores: slots },
            os_info: ExecutorOperatingSystemSpecification::default(),
        };
        let data = ExecutorData {
            executor_id: id,
            total_vcores: slots,
            available_vcores: slots,
        };
        cluster
            .register_executor(metadata, data)
            .await
            .map_err(|e| DataFusionError::External(e.into()))?;
    }
    Ok(cluster)
}

/// Binds the running scan stage of a new job of `files` files on a new cluster of
/// `executors`, by the affinity policy over that cluster or else by Ballista's own.
async fn bind(
    files: u64,
    partitions: u64,
    executors: u64,
    slots: u32,
    affinity: bool,
) -> Result<Binding> {
    let cluster = cluster(executors, slots).await?;
    let (distribution, policy) = if affinity {
        let policy = Arc::new(AffinityPolicy::new(
            Arc::clone(&cluster) as Arc<dyn ClusterState>
        ));
        let custom: Arc<dyn DistributionPolicy> = Arc::clone(&policy) as _;
        (TaskDistributionPolicy::Custom(custom), Some(policy))
    } else {
        (TaskDistributionPolicy::Bias, None)
    };
    let job = JobId::new("placement");
    let mut graph = StaticExecutionGraph::new(
        "scheduler",
        &job,
        "placement",
        "session",
        plan(files, partitions)?,
        0,
        Arc::new(SessionConfig::new()),
        &mut DefaultDistributedPlanner::new(),
        None,
    )
    .map_err(|e| DataFusionError::External(e.into()))?;
    graph.revive();
    let jobs = Arc::new(HashMap::from([(job, JobInfoCache::new(Box::new(graph)))]));

    // The vcores each executor has bound, in registration order: an event frees the next
    // busy executor's (its tasks finished), as a task status update does.
    let mut busy: Vec<(String, u32)> = (0..executors)
        .map(|i| (format!("executor-{i:03}"), 0))
        .collect();
    let mut binding = Binding {
        first: Duration::ZERO,
        rest: Vec::new(),
        tasks: 0,
        preferred: None,
    };
    let mut bound = 0;
    let mut turn = 0usize;
    let started = Instant::now();
    while bound < partitions as usize {
        if turn > 0 {
            let next = (0..busy.len())
                .map(|k| (turn + k) % busy.len())
                .find(|&k| busy[k].1 > 0);
            if let Some(k) = next {
                let vcores = std::mem::take(&mut busy[k].1);
                let name = busy[k].0.clone();
                cluster
                    .unbind_tasks(vec![(name, vcores)])
                    .await
                    .map_err(|e| DataFusionError::External(e.into()))?;
            }
            // With no executor busy, the pending partitions are waiting for their
            // preferred executor: bind again, as the scheduler's next event would.
        }
        let t = Instant::now();
        let tasks = cluster
            .bind_schedulable_tasks(distribution.clone(), Arc::clone(&jobs), None)
            .await
            .map_err(|e| DataFusionError::External(e.into()))?;
        let took = t.elapsed();
        match turn {
            0 => binding.first = took,
            _ => binding.rest.push(took),
        }
        binding.tasks += tasks.len();
        for (executor, task) in &tasks {
            bound += task.global_input_partition_ids.len();
            if let Some(slot) = busy.iter_mut().find(|(name, _)| name == executor) {
                slot.1 += task.vcores_consumed;
            }
        }
        turn += 1;
        if started.elapsed() > Duration::from_secs(600) {
            return Err(DataFusionError::Execution(format!(
                "{bound} of {partitions} partitions bound after 10 minutes"
            )));
        }
    }
    binding.preferred = policy.map(|p| p.stats().preferred);
    Ok(binding)
}

fn main() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let partitions = list("--partitions", &[1_000])[0];
    let slots = list("--slots", &[2])[0] as u32;
    println!(
        "| files | executors | policy | first event | other events: median / slowest | events | tasks (preferred) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for files in list("--files", &[20_000, 200_000]) {
        for executors in list("--executors", &[10, 100]) {
            for affinity in [false, true] {
                let b = runtime.block_on(bind(files, partitions, executors, slots, affinity))?;
                println!(
                    "| {files} | {executors} | {} | {:.1} ms | {} | {} | {}{} |",
                    if affinity {
                        "affinity"
                    } else {
                        "Ballista's (bias)"
                    },
                    ms(b.first),
                    match b.rest.is_empty() {
                        true => "none".to_string(),
                        false => format!(
                            "{:.3} / {:.3} ms",
                            percentile(&b.rest, 50.0),
                            percentile(&b.rest, 100.0)
                        ),
                    },
                    b.rest.len() + 1,
                    b.tasks,
                    b.preferred.map_or(String::new(), |p| format!(" ({p})")),
                );
            }
        }
    }
    Ok(())
}
