//! Many sessions at once over one `LakeCache` with tiny capacities (constant eviction),
//! millisecond TTLs and objects replaced during the run: no panic, no deadlock (the test
//! has a deadline), every cache within its bound, and every descriptor closed afterwards.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{Backend, local_backend, memory_backend, rows};
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::testkit::lake::{LakeSpec, file_bytes};
use object_store::{ObjectStoreExt, PutPayload};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const SESSIONS: usize = 16;
const QUERIES_EACH: usize = 50;
const FILES: usize = 8;

const QUERIES: [&str; 5] = [
    "SELECT count(*), sum(id) FROM t",
    "SELECT * FROM t WHERE id = 4242",
    "SELECT id FROM t WHERE name = 'name-012345'",
    "SELECT category, count(*) FROM t GROUP BY category",
    "SELECT id, value FROM t WHERE id BETWEEN 1200 AND 1260",
];

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

fn tiny(dir: &std::path::Path) -> LakeCache {
    LakeCache::builder()
        .handle_capacity(8)
        .handle_listing_bytes(2 << 10)
        .handle_ttl(Duration::from_millis(20))
        .list_ttl(Duration::from_millis(5))
        .max_open_files(4)
        .index_capacity_bytes(64 << 10)
        .set("lakecache.index.max_entry_percent", "100")
        .range_memory_bytes(1 << 20)
        .range_disk(dir, 1 << 20)
        .build()
        .unwrap()
}

async fn session(b: &Backend, lake: &LakeCache, s: usize) -> SessionContext {
    let builder = SessionStateBuilder::new()
        .with_default_features()
        .with_config(SessionConfig::new().with_target_partitions(2));
    let ctx = SessionContext::new_with_state(lake.install(builder).unwrap().build());
    ctx.register_object_store(&b.store_url, Arc::clone(&b.raw));
    // Registration may meet a file being replaced; try again then.
    for attempt in 0.. {
        let registered = ctx
            .register_parquet("t", b.table_url(), ParquetReadOptions::default())
            .await;
        match registered {
            Ok(()) => break,
            Err(e) if attempt < 20 => eprintln!("session {s}: registering again: {e}"),
            Err(e) => panic!("session {s}: {e}"),
        }
    }
    ctx
}

async fn load(b: Backend) {
    let spec = LakeSpec::small_files(FILES).with_row_groups_of(1_000);
    b.write(&spec).await;
    let b = Arc::new(b);
    let dir = tempfile::tempdir().unwrap();
    let before = open_descriptors();
    let lake = tiny(dir.path());
    let stop = Arc::new(AtomicBool::new(false));
    // Another writer replaces files all through the run.
    let writer = {
        let (b_raw, prefix, stop) = (Arc::clone(&b.raw), b.prefix.clone(), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut rng = SmallRng::seed_from_u64(7);
            let mut replaced = 0;
            while !stop.load(Ordering::Relaxed) {
                let i = rng.random_range(0..FILES);
                let bytes = file_bytes(&spec.with_seed(rng.random()), i).unwrap();
                let path = prefix.clone().join(LakeSpec::file_name(i));
                b_raw.put(&path, PutPayload::from(bytes)).await.unwrap();
                replaced += 1;
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
            replaced
        })
    };
    let mut tasks = Vec::new();
    for s in 0..SESSIONS {
        let (b, lake) = (Arc::clone(&b), lake.clone());
        tasks.push(tokio::spawn(async move {
            let ctx = session(&b, &lake, s).await;
            let mut rng = SmallRng::seed_from_u64(s as u64);
            let (mut ok, mut failed) = (0, 0);
            for _ in 0..QUERIES_EACH {
                let sql = QUERIES[rng.random_range(0..QUERIES.len())];
                match rows(&ctx, sql).await {
                    Ok(_) => ok += 1,
                    Err(e) => {
                        let msg = e.to_string();
                        assert!(msg.contains("part-0"), "session {s}: `{sql}`: {msg}");
                        failed += 1;
                    }
                }
            }
            assert!(
                ok > 0,
                "session {s}: no query was answered ({failed} refused)"
            );
            (ok, failed)
        }));
    }
    let run = async {
        let mut total = (0, 0);
        for t in tasks {
            let (ok, failed) = t.await.unwrap();
            total = (total.0 + ok, total.1 + failed);
        }
        total
    };
    let (ok, failed) = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .unwrap_or_else(|_| panic!("{}: the sessions did not finish: a deadlock", b.name));
    stop.store(true, Ordering::Relaxed);
    let replaced = writer.await.unwrap();
    // A file replaced under a query fails that query (never gives a mix of versions); the
    // rest are answered: far more than the few a replacement every 15 ms can spoil.
    assert!(
        ok * 5 >= SESSIONS * QUERIES_EACH,
        "{}: only {ok} of {} queries answered",
        b.name,
        SESSIONS * QUERIES_EACH
    );
    let s = lake.stats();
    common::report(
        "load",
        &format!(
            "load {}: {SESSIONS} sessions x {QUERIES_EACH} queries: {ok} answered, {failed} \
             refused a changed file, {replaced} replacements; within bounds: metadata {} of \
             8, listings {} of 2048 bytes, descriptors {} of 4, index {} of 65536 bytes, memory {} of \
             1048576 bytes, disk {} of 1048576 bytes; {} index and {} range evictions",
            b.name,
            s.handle.metadata.entries,
            s.handle.listing_bytes,
            s.handle.files.entries,
            s.index.bytes,
            s.range.memory_bytes,
            s.range.disk_bytes,
            s.index.footers.evictions,
            s.range.memory.evictions
        ),
    );
    assert!(s.handle.metadata.entries <= 8, "{s:?}");
    assert!(s.handle.listing_bytes <= 2 << 10, "{s:?}");
    assert!(s.handle.files.entries <= 4, "{s:?}");
    assert!(s.index.bytes <= 64 << 10, "{s:?}");
    assert!(s.range.memory_bytes <= 1 << 20, "{s:?}");
    assert!(s.range.disk_bytes <= 1 << 20, "{s:?}");
    assert!(
        s.index.footers.evictions + s.range.memory.evictions > 0,
        "constant eviction: {s:?}"
    );
    // Every descriptor closed once the caches let go of them (and the disk tier's writes
    // are done).
    lake.flush().await;
    lake.clear();
    drop(lake);
    let mut after = open_descriptors();
    for _ in 0..50 {
        if after <= before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        after = open_descriptors();
    }
    assert!(
        after <= before + 2,
        "{}: {before} descriptors before, {after} after",
        b.name
    );
}

/// One test, the backends one after the other: descriptors are counted for the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_sessions_with_tiny_caches_over_a_changing_lake_answer_within_every_bound() {
    load(local_backend()).await;
    load(memory_backend()).await;
}
