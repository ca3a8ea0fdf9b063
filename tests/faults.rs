//! The seeded differential fault loop: queries through every cache (the disk tier included)
//! and prefetching, under injected faults and objects replaced behind the caches' back,
//! against DataFusion alone over a fault-free store. Every answer must be exactly the
//! baseline's for a state the lake has been in, or an error naming the object; then, with
//! faults off and nothing cleared, every query must answer without error (nothing
//! poisoned was kept).
//!
//! Two stores: the in-memory store behind `testkit::FaultStore` (failed GETs, HEADs and
//! LISTs), and the S3 server behind `testkit::FaultProxy` (responses cut mid-header and
//! mid-body, connection resets, `503 SlowDown` bursts, stalls past the client's timeout).
//!
//! `LAKECACHE_FAULT_ITERATIONS` (default 200) sets the iterations, `LAKECACHE_FAULT_SEED`
//! the seed; a failure prints the seed and iteration to replay.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Backend, rows, scan};
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::testkit::lake::{LakeSpec, file_bytes};
use datafusion_lakecache::testkit::{
    FaultProxy, FaultStore, Faults, Op, s3_server_addr, s3_store_via,
};
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Queries of the corpus that read different parts of the lake.
const QUERIES: [&str; 8] = [
    "SELECT * FROM t WHERE id = 4242",
    "SELECT id, value FROM t WHERE id BETWEEN 1200 AND 1260",
    "SELECT * FROM t WHERE name = 'name-012345'",
    "SELECT count(*) FROM t WHERE note IS NULL",
    "SELECT category, count(*), round(sum(value), 3) FROM t GROUP BY category",
    "SELECT name FROM t WHERE id % 1000 = 7 ORDER BY name LIMIT 5",
    "SELECT count(*), sum(id), min(name), max(ts) FROM t",
    "SELECT min(value), max(value) FROM t WHERE id BETWEEN 3000 AND 3999",
];

const FILES: usize = 4;

fn iterations() -> usize {
    std::env::var("LAKECACHE_FAULT_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

fn seed() -> u64 {
    std::env::var("LAKECACHE_FAULT_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_261_201)
}

fn spec() -> LakeSpec {
    LakeSpec::small_files(FILES).with_row_groups_of(1_000)
}

/// Where faults come from.
enum Source {
    Store(Arc<FaultStore<Arc<dyn ObjectStore>>>),
    Proxy(FaultProxy),
}

impl Source {
    /// Faults for the next query, drawn from `rng`.
    fn inject(&self, rng: &mut SmallRng) {
        match self {
            Source::Store(store) => {
                for op in [Op::Get, Op::Head, Op::List] {
                    let n = if rng.random_bool(0.3) {
                        rng.random_range(1..4)
                    } else {
                        0
                    };
                    store.fail(op, n);
                }
            }
            Source::Proxy(proxy) => {
                let p = [0.0, 0.01, 0.03, 0.08][rng.random_range(0..4)];
                proxy.set(Faults::all(p, Duration::from_millis(1500)));
            }
        }
    }

    fn off(&self) {
        match self {
            Source::Store(store) => {
                for op in [Op::Get, Op::Head, Op::List] {
                    store.fail(op, 0);
                }
            }
            Source::Proxy(proxy) => proxy.set(Faults::none()),
        }
    }

    /// What was injected, by kind.
    fn describe(&self) -> String {
        match self {
            Source::Store(_) => "failed GETs, HEADs and LISTs".to_string(),
            Source::Proxy(proxy) => {
                let c = proxy.counts();
                format!(
                    "{} heads cut, {} bodies cut, {} resets, {} 503 SlowDown, {} stalls",
                    c.cut_head, c.cut_body, c.reset, c.slow_down, c.stalled
                )
            }
        }
    }

    fn injected(&self) -> u64 {
        match self {
            Source::Store(store) => store.injected(),
            Source::Proxy(proxy) => proxy.counts().faults(),
        }
    }
}

/// The figures of one run of the loop.
#[derive(Debug, Default)]
struct Figures {
    queries: u64,
    errors: u64,
    replacements: u64,
    faults: u64,
}

/// DataFusion alone over the fault-free store: every query's answer now.
async fn baseline(b: &Backend) -> Vec<Vec<String>> {
    let mut answers = Vec::new();
    for sql in QUERIES {
        answers.push(scan(b, Arc::clone(&b.raw), sql).await.unwrap());
    }
    answers
}

async fn run(name: &str, b: &Backend, faulty: Arc<dyn ObjectStore>, source: Source) -> Figures {
    let seed = seed();
    let dir = tempfile::tempdir().unwrap();
    // Short TTLs and small tiers: listings and versions are learned again, and bytes evicted
    // and read again, all through the run, so the store (and its faults) is met often.
    let lake = LakeCache::builder()
        .list_ttl(Duration::from_millis(20))
        .handle_ttl(Duration::from_millis(50))
        .index_capacity_bytes(256 << 10)
        .set("lakecache.index.max_entry_percent", "100")
        .range_memory_bytes(1 << 20)
        .range_disk(dir.path(), 2 << 20)
        .build()
        .unwrap();
    let builder = SessionStateBuilder::new()
        .with_default_features()
        .with_config(SessionConfig::new().with_target_partitions(2));
    let ctx = SessionContext::new_with_state(lake.install(builder).unwrap().build());
    ctx.register_object_store(&b.store_url, faulty);
    ctx.register_parquet("t", b.table_url(), ParquetReadOptions::default())
        .await
        .unwrap();
    let mut states = vec![baseline(b).await];
    let mut figures = Figures::default();
    let file0 = b.prefix.clone().join(LakeSpec::file_name(0));
    let failed = |i: usize, what: String| -> ! {
        panic!("{name}: seed {seed}, iteration {i} (LAKECACHE_FAULT_SEED={seed} to replay): {what}")
    };
    for i in 0..iterations() {
        let mut rng = SmallRng::seed_from_u64(seed ^ (i as u64).wrapping_mul(0x9E37_79B9));
        if rng.random_bool(0.15) {
            // Replaced directly on the store, behind the caches' back.
            let bytes = file_bytes(&spec().with_seed(seed ^ i as u64), 0).unwrap();
            b.raw.put(&file0, PutPayload::from(bytes)).await.unwrap();
            states.push(baseline(b).await);
            figures.replacements += 1;
        }
        let q = rng.random_range(0..QUERIES.len());
        source.inject(&mut rng);
        let got = tokio::time::timeout(Duration::from_secs(60), rows(&ctx, QUERIES[q])).await;
        source.off();
        figures.queries += 1;
        match got {
            Err(_) => failed(i, format!("`{}` hung", QUERIES[q])),
            Ok(Ok(answer)) => {
                if !states.iter().any(|s| s[q] == answer) {
                    failed(
                        i,
                        format!("`{}` answered {answer:?}, no state's answer", QUERIES[q]),
                    );
                }
            }
            Ok(Err(e)) => {
                figures.errors += 1;
                let msg = e.to_string();
                let names_it = msg.contains(b.prefix.as_ref()) || msg.contains("part-0");
                if !names_it {
                    failed(
                        i,
                        format!("`{}` failed without naming the object: {msg}", QUERIES[q]),
                    );
                }
            }
        }
    }
    // Faults off, nothing cleared: nothing poisoned was kept.
    for (q, sql) in QUERIES.iter().enumerate() {
        let answer = rows(&ctx, sql)
            .await
            .unwrap_or_else(|e| failed(usize::MAX, format!("after faults: `{sql}`: {e}")));
        if !states.iter().any(|s| s[q] == answer) {
            failed(
                usize::MAX,
                format!("after faults: `{sql}` answered {answer:?}"),
            );
        }
    }
    figures.faults = source.injected();
    // Once the last scan's grace period is over, nothing is held.
    let left = common::leftovers(&lake).await;
    assert!(left.is_empty(), "{name}: {left}");
    common::report(
        "faults",
        &format!(
            "fault loop {name}: seed {seed}, {} iterations, {} queries, {} faults injected ({}), \
         {} errors naming the object, {} replacements, 0 wrong answers, 0 errors after faults \
         off",
            iterations(),
            figures.queries,
            figures.faults,
            source.describe(),
            figures.errors,
            figures.replacements
        ),
    );
    figures
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_requests_of_the_in_memory_store_give_named_errors_or_a_states_rows() {
    let b = common::memory_backend();
    b.write(&spec()).await;
    let faults = Arc::new(FaultStore::new(Arc::clone(&b.raw)));
    let figures = run("memory", &b, faults.clone(), Source::Store(faults)).await;
    assert!(
        figures.errors > 0,
        "faults were injected and seen: {figures:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_faulty_network_to_the_s3_server_gives_named_errors_or_a_states_rows() {
    let Some(b) = common::s3_backend("fault_loop") else {
        return;
    };
    b.write(&spec()).await;
    let addr = s3_server_addr().unwrap();
    let proxy = FaultProxy::start(addr, seed()).await.unwrap();
    let faulty: Arc<dyn ObjectStore> =
        Arc::new(s3_store_via(&proxy.endpoint(), Duration::from_millis(1000), 2).unwrap());
    let figures = run("s3", &b, faulty, Source::Proxy(proxy)).await;
    assert!(figures.faults > 0, "{figures:?}");
}
