//! First contact: a lake this process has never seen, `CREATE EXTERNAL TABLE` and the first
//! query, by vanilla DataFusion and by a session installed from a new `LakeCache`, side by
//! side, against the link's limit.
//!
//! The limit: a round trip for the LIST, one for the footers, one for each further round the
//! query's pruning needs (bloom filters), one for its data, plus every byte they carry over
//! the link: `rounds x latency + bytes / bandwidth`, with the bytes lakecache downloaded.
//!
//! Workloads (in memory, with S3's digest e_tags, behind `latency` per real request and one
//! 1 Gbit/s link, as `s3://lake`):
//! - group-by: 200 files of 5,000 rows, the whole of two columns;
//! - two files: a filter whose `id` range only two of the 200 files hold;
//! - bloom lookup: 20 files of 8 row groups, `name =` a value one row has, which only bloom
//!   filters can prune row groups by;
//! - page lookup: the 200 files, `id =` one value, which file statistics and the page index
//!   prune to one page.
//!
//! Each figure is the median of `--runs` (default 3) fresh process states (a new `LakeCache`,
//! a new session). `cargo bench --bench first` (options: `-- --runs N --latencies 5,25,100
//! --partitions 2,8,16`): the first latency runs at every partition count, the others at 2.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Remote, arg, list, memory_lake, ms, remote, run};
use datafusion::error::Result;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::testkit::lake::LakeSpec;
use object_store::ObjectStore;
use url::Url;

const BANDWIDTH: u64 = 125_000_000;

struct Workload {
    name: &'static str,
    spec: LakeSpec,
    sql: &'static str,
    /// Round trips the limit needs: LIST, footers, any pruning round, data.
    rounds: u32,
}

fn workloads() -> Vec<Workload> {
    let small = LakeSpec::small_files(200);
    vec![
        Workload {
            name: "group-by",
            spec: small,
            sql: "SELECT category, round(sum(value), 3) FROM t GROUP BY category",
            rounds: 3,
        },
        Workload {
            name: "two files",
            spec: small,
            sql: "SELECT count(*), round(sum(value), 3) FROM t \
                  WHERE id BETWEEN 185000 AND 194999",
            rounds: 3,
        },
        Workload {
            name: "bloom lookup",
            spec: LakeSpec::small_files(20).with_row_groups_of(625),
            sql: "SELECT id, name FROM t WHERE name = 'name-012345'",
            rounds: 4,
        },
        Workload {
            name: "page lookup",
            spec: small,
            sql: "SELECT id, name, value FROM t WHERE id = 424242",
            rounds: 3,
        },
    ]
}

/// One first contact: what it took and what reached the store.
#[derive(Clone, Copy)]
struct Contact {
    create: Duration,
    total: Duration,
    gets: u64,
    bytes: u64,
}

async fn first_contact(
    store: &Arc<Remote>,
    cached: bool,
    partitions: usize,
    sql: &str,
) -> Result<(usize, Contact)> {
    let lake = LakeCache::builder().build()?;
    let config = SessionConfig::new().with_target_partitions(partitions);
    let ctx: SessionContext =
        datafusion_lakecache::testkit::context(cached.then_some(&lake), config)?;
    let url = Url::parse("s3://lake").expect("static URL");
    ctx.register_object_store(&url, Arc::clone(store) as Arc<dyn ObjectStore>);
    store.reset();
    let began = Instant::now();
    ctx.sql("CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION 's3://lake/lake/'")
        .await?;
    let create = began.elapsed();
    let (rows, _) = run(&ctx, sql).await?;
    let total = began.elapsed();
    let c = store.counts();
    // Hedged copies are counted apart: at most one request in twenty.
    let hedged = lake.stats().store.hedged;
    Ok((
        rows,
        Contact {
            create,
            total,
            gets: c.get - hedged.min(c.get),
            bytes: store.bytes(),
        },
    ))
}

fn median(mut runs: Vec<Contact>) -> Contact {
    runs.sort_by_key(|c| c.total);
    runs[runs.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let runs = arg("--runs", 3) as usize;
    let latencies = list("--latencies", &[25, 5, 100]);
    let partitions = list("--partitions", &[2, 8, 16]);
    println!(
        "first contact (CREATE EXTERNAL TABLE + first query), S3-like e_tags, one 1 Gbit/s \
         link; medians of {runs} fresh process states; GETs exclude hedged copies"
    );
    for w in workloads() {
        let (memory, _) = memory_lake(&w.spec).await?;
        for (i, &latency_ms) in latencies.iter().enumerate() {
            let latency = Duration::from_millis(latency_ms);
            let store = remote(memory.clone() as Arc<dyn ObjectStore>, latency, BANDWIDTH).await?;
            let counts: &[u64] = if i == 0 { &partitions } else { &[2] };
            for &p in counts {
                let mut sides = [Vec::new(), Vec::new()];
                let mut rows = [0, 0];
                for _ in 0..runs {
                    // Alternating, so drift on a shared machine hits both alike.
                    for (side, cached) in [(0, false), (1, true)] {
                        let (n, c) = first_contact(&store, cached, p as usize, w.sql).await?;
                        rows[side] = n;
                        sides[side].push(c);
                    }
                }
                assert_eq!(rows[0], rows[1], "{}: both sides' rows", w.name);
                let (vanilla, ours) = (median(sides[0].clone()), median(sides[1].clone()));
                let limit = w.rounds as f64 * latency_ms as f64
                    + 1000.0 * ours.bytes as f64 / BANDWIDTH as f64;
                println!(
                    "  {:<12} {latency_ms:>3} ms p{p:<2} vanilla {:>7.1} ms (CREATE {:>6.1}) {:>4} \
                     GETs {:>6.2} MiB | lakecache {:>7.1} ms (CREATE {:>6.1}) {:>4} GETs {:>6.2} MiB \
                     | {:>5.2}x faster, {:.2}x the bytes | limit {:>6.1} ms, lakecache {:.2}x it",
                    w.name,
                    ms(vanilla.total),
                    ms(vanilla.create),
                    vanilla.gets,
                    vanilla.bytes as f64 / (1 << 20) as f64,
                    ms(ours.total),
                    ms(ours.create),
                    ours.gets,
                    ours.bytes as f64 / (1 << 20) as f64,
                    ms(vanilla.total) / ms(ours.total),
                    ours.bytes as f64 / vanilla.bytes as f64,
                    limit,
                    ms(ours.total) / limit,
                );
            }
        }
    }
    Ok(())
}
