//! The Delta Lake benchmark: a table of 8 commits (one file each, 200,000 rows in row groups
//! of 50,000) and a checkpoint, behind a simulated remote store (25 ms per real request,
//! below range coalescing; one 1 Gbit/s link), registered as `s3://delta`. delta-rs alone
//! against delta-rs through the caches (`delta::table_builder` and an installed session),
//! side by side, run by run: each run is a new snapshot load and a new session, as a service
//! answering each query afresh would have.
//!
//! `cargo bench --bench delta --features delta` (options: `-- --runs N --gbit N`).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Remote, arg, ms, remote};
use datafusion::arrow::array::RecordBatch;
use datafusion::error::Result;
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::SessionContext;
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::delta::register_default_log_stores;
use datafusion_lakecache::testkit::RequestCounts;
use datafusion_lakecache::testkit::delta::delta_batch;
use datafusion_lakecache::testkit::lake::LakeSpec;
use deltalake_core::protocol::SaveMode;
use deltalake_core::{DeltaTable, DeltaTableBuilder};
use futures::TryStreamExt;
use object_store::ObjectStore;
use object_store::memory::InMemory;
use url::Url;

const QUERIES: [(&str, &str); 2] = [
    (
        "group-by",
        "SELECT category, count(*), round(sum(value), 3) FROM t GROUP BY category",
    ),
    (
        "filter",
        "SELECT id, name, value FROM t WHERE id BETWEEN 400000 AND 400500",
    ),
];

fn external(
    e: impl std::error::Error + Send + Sync + 'static,
) -> datafusion::error::DataFusionError {
    datafusion::error::DataFusionError::External(Box::new(e))
}

/// One side's figures per run: load + query time, and the requests that reached the store.
#[derive(Default)]
struct Runs {
    times: Vec<Duration>,
    requests: Vec<RequestCounts>,
}

impl Runs {
    fn show(&self) -> String {
        self.times
            .iter()
            .zip(&self.requests)
            .map(|(t, r)| format!("{:>8.1} ms {:>3}/{}/{:<4}", ms(*t), r.head, r.list, r.get))
            .collect::<Vec<_>>()
            .join(" |")
    }
}

/// Loads the table (through `lake`'s caches if given) and runs `sql` in a new session.
async fn load_and_query(
    url: &Url,
    store: &Arc<Remote>,
    session_store: &Arc<dyn ObjectStore>,
    lake: Option<&LakeCache>,
    sql: &str,
) -> Result<usize> {
    let remote = Arc::clone(store) as Arc<dyn ObjectStore>;
    let (table, ctx) = match lake {
        Some(lake) => {
            let table = datafusion_lakecache::delta::table_builder(lake, url, remote)
                .map_err(external)?
                .load()
                .await
                .map_err(external)?;
            let builder = SessionStateBuilder::new().with_default_features();
            (
                table,
                SessionContext::new_with_state(lake.install(builder)?.build()),
            )
        }
        None => {
            let mut table = DeltaTableBuilder::from_url(url.clone())
                .map_err(external)?
                .with_storage_backend(remote, url.clone())
                .build()
                .map_err(external)?;
            table.load().await.map_err(external)?;
            (table, SessionContext::new())
        }
    };
    let root = Url::parse("s3://delta").expect("static URL");
    ctx.register_object_store(&root, Arc::clone(session_store));
    ctx.register_table("t", table.table_provider().await.map_err(external)?)?;
    let batches = ctx.sql(sql).await?.collect().await?;
    Ok(batches.iter().map(RecordBatch::num_rows).sum())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let runs = arg("--runs", 4) as usize;
    let bandwidth = arg("--gbit", 1) * 125_000_000;
    let latency = Duration::from_millis(25);
    register_default_log_stores();

    // The table, written by delta-rs alone into an in-memory store (sorted listings, as
    // object stores give them).
    let spec = LakeSpec {
        files: 8,
        rows_per_file: 200_000,
        row_group_rows: 50_000,
        seed: 42,
    };
    let local = Arc::new(InMemory::new()) as Arc<dyn ObjectStore>;
    let url = Url::parse("s3://delta/sales/").expect("static URL");
    let mut table: DeltaTable = DeltaTableBuilder::from_url(url.clone())
        .map_err(external)?
        .with_storage_backend(Arc::clone(&local), url.clone())
        .build()
        .map_err(external)?;
    for i in 0..spec.files {
        let batch = delta_batch(&spec, i);
        table = table
            .write(vec![batch])
            .with_save_mode(SaveMode::Append)
            .await
            .map_err(external)?;
    }
    deltalake_core::checkpoints::create_checkpoint(&table, None)
        .await
        .map_err(external)?;
    let bytes: u64 = local
        .list(None)
        .map_ok(|m| m.size)
        .try_fold(0, |a, b| async move { Ok(a + b) })
        .await?;
    println!(
        "Delta table: {} commits of {} rows (row groups of {}), a checkpoint, {:.1} MB; \
         {latency:?} per request; link {} Gbit/s",
        spec.files,
        spec.rows_per_file,
        spec.row_group_rows,
        bytes as f64 / 1e6,
        bandwidth / 125_000_000
    );
    println!("each run: a new snapshot load and a new session; requests HEAD/LIST/GET");

    for (name, sql) in QUERIES {
        let plain_store = remote(Arc::clone(&local), latency, bandwidth).await?;
        let lake_store = remote(Arc::clone(&local), latency, bandwidth).await?;
        let lake = LakeCache::builder().build()?;
        // The session's store, registered once per process as a server would.
        let plain_session = Arc::clone(&plain_store) as Arc<dyn ObjectStore>;
        let lake_session = Arc::new(datafusion_lakecache::CachingObjectStore::new_arc(
            Arc::clone(&lake_store),
            &Url::parse("s3://delta").expect("static URL"),
            &lake,
        )) as Arc<dyn ObjectStore>;
        let (mut plain, mut ours) = (Runs::default(), Runs::default());
        for _ in 0..runs {
            for (side, store, session, cache) in [
                (&mut plain, &plain_store, &plain_session, None),
                (&mut ours, &lake_store, &lake_session, Some(&lake)),
            ] {
                store.reset();
                let start = Instant::now();
                let rows = load_and_query(&url, store, session, cache, sql).await?;
                assert!(rows > 0, "{name}: rows");
                side.times.push(start.elapsed());
                side.requests.push(store.counts());
            }
        }
        println!("{name}: {sql}");
        println!("  delta-rs alone      {}", plain.show());
        println!("  delta-rs, lakecache {}", ours.show());
        let last = |r: &Runs| ms(r.times[runs - 1]);
        println!(
            "  cold: {:.2}x, warm (run {runs}): {:.1}x faster through the caches",
            ms(plain.times[0]) / ms(ours.times[0]),
            last(&plain) / last(&ours)
        );
    }
    Ok(())
}
