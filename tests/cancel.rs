//! Queries dropped at random points (by a `LIMIT`, a timeout, or a consumer that stops
//! reading), with the index cache on and off: afterwards nothing of them is left, no
//! prefetch reservation, download in flight, live lease, or index load.
//!
//! `LAKECACHE_CANCEL_QUERIES` (default 1000) sets how many queries run.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::memory_backend;
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::testkit::LatencyStore;
use datafusion_lakecache::testkit::lake::LakeSpec;
use futures::StreamExt;
use object_store::ObjectStore;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const QUERIES: [&str; 4] = [
    "SELECT * FROM t",
    "SELECT id, name FROM t WHERE name = 'name-012345'",
    "SELECT category, count(*), sum(value) FROM t GROUP BY category",
    "SELECT id FROM t WHERE id > 100 LIMIT 7",
];

fn queries() -> usize {
    std::env::var("LAKECACHE_CANCEL_QUERIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

/// Runs `sql` and drops it at a point drawn from `rng`: after its first poll, after a few
/// batches, after a few milliseconds, or never (to its end).
async fn drop_somewhere(ctx: &SessionContext, sql: &str, rng: &mut SmallRng) {
    let mode = rng.random_range(0..4);
    let keep_batches = rng.random_range(0..3);
    let ms = rng.random_range(0..20);
    let run = async {
        let stream: datafusion::error::Result<_> =
            async { ctx.sql(sql).await?.execute_stream().await }.await;
        let mut stream = stream?;
        let keep = if mode == 1 { keep_batches } else { usize::MAX };
        let mut batches = 0;
        while let Some(batch) = stream.next().await {
            let _: datafusion::arrow::array::RecordBatch = batch?;
            batches += 1;
            if batches > keep {
                break;
            }
        }
        Ok::<(), datafusion::error::DataFusionError>(())
    };
    match mode {
        0 => {
            // Dropped after its first poll.
            let _ = tokio::time::timeout(Duration::ZERO, run).await;
        }
        2 => {
            let _ = tokio::time::timeout(Duration::from_millis(ms), run).await;
        }
        _ => run.await.unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_queries_leave_no_reservation_download_lease_or_load() {
    for index_cache in [true, false] {
        let b = memory_backend();
        b.write(&LakeSpec::small_files(12).with_row_groups_of(1_000))
            .await;
        // Requests take a little while, so queries are dropped with work under way; small
        // files are fetched in chunks, footers loaded by the prefetcher.
        let slow: Arc<dyn ObjectStore> = Arc::new(LatencyStore::new(
            Arc::clone(&b.raw),
            Duration::from_millis(2),
        ));
        let lake = LakeCache::builder()
            .index_cache(index_cache)
            .range_cache(false)
            .set("lakecache.prefetch.small_file", "1KiB")
            .build()
            .unwrap();
        let builder = SessionStateBuilder::new()
            .with_default_features()
            .with_config(SessionConfig::new().with_target_partitions(2));
        let ctx = SessionContext::new_with_state(lake.install(builder).unwrap().build());
        ctx.register_object_store(&b.store_url, slow);
        ctx.register_parquet("t", b.table_url(), ParquetReadOptions::default())
            .await
            .unwrap();
        let mut rng = SmallRng::seed_from_u64(index_cache as u64);
        let n = queries() / 2;
        for _ in 0..n {
            let sql = QUERIES[rng.random_range(0..QUERIES.len())];
            drop_somewhere(&ctx, sql, &mut rng).await;
        }
        let left = common::leftovers(&lake).await;
        assert!(
            left.is_empty(),
            "index cache {index_cache}: after {n} queries: {left}"
        );
        let p = lake.stats().prefetch;
        common::report(
            "cancel",
            &format!(
                "cancel, index cache {index_cache}: {n} queries dropped or run ({} scans, {} \
                 downloads cancelled, {} bytes fetched and dropped unread); left: 0 bytes \
                 reserved, 0 downloads in flight, 0 leases, 0 index loads",
                p.scans, p.cancelled, p.bytes_wasted
            ),
        );
        assert!(
            p.scans > 0 && p.cancelled + p.bytes_wasted > 0,
            "some were cut short: {p:?}"
        );
    }
}
