//! The index-cache benchmark: point lookups (`WHERE id = k`, `WHERE name = 's'`, both on
//! columns with bloom filters and a page index) over 50 files x 8 row groups on a simulated
//! store charging 25 ms per request, 20 queries in one session, vanilla DataFusion and
//! LakeTable side by side. Four distinct lookups run once cold, then again and again until
//! `--queries` have run; "warm" is every run after the first round.
//!
//! `cargo bench --bench index` (options: `-- --files N --queries N --latency-ms MS`).
//! Queries alternate between the two sides so drift on a shared machine hits both alike.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::arg;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use datafusion_lakecache::testkit::lake::{LakeSpec, file_bytes, write_lake};
use datafusion_lakecache::testkit::requests::{ReadCounts, count_reads};
use datafusion_lakecache::testkit::{CountingStore, LatencyStore};
use datafusion_lakecache::{CachingObjectStore, LakeCache, LakeTable};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaDataReader};
use url::Url;

#[derive(Default)]
struct Side {
    cold: Duration,
    warm: Duration,
    warm_reads: ReadCounts,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> datafusion::error::Result<()> {
    let files = arg("--files", 50) as usize;
    let queries = arg("--queries", 20) as usize;
    let latency = Duration::from_millis(arg("--latency-ms", 25));
    let spec = LakeSpec {
        files,
        rows_per_file: 8_000,
        row_group_rows: 1_000,
        seed: 42,
    };
    let dir = tempfile::tempdir()?;
    let fs = Arc::new(LocalFileSystem::new());
    let prefix = Path::from_absolute_path(dir.path().join("lake"))?;
    write_lake(fs.as_ref(), &prefix, &spec).await?;
    let index: HashMap<_, _> = (0..files)
        .map(|i| {
            let bytes = file_bytes(&spec, i).expect("generated file");
            let metadata = ParquetMetaDataReader::new()
                .with_page_index_policy(PageIndexPolicy::Optional)
                .parse_and_finish(&bytes)
                .expect("generated footer");
            (
                prefix.clone().join(LakeSpec::file_name(i)),
                (Arc::new(metadata), bytes.len() as u64),
            )
        })
        .collect();
    let url = Url::parse("file://").expect("static URL");
    let table_url = format!("{}/", dir.path().join("lake").display());
    let config = || SessionConfig::new().with_target_partitions(2);
    const DISTINCT: usize = 4;
    let sql = |q: usize| {
        let q = q % DISTINCT;
        let id = (q * 7_919 + 13) % (files * spec.rows_per_file);
        if q.is_multiple_of(2) {
            format!("SELECT * FROM t WHERE id = {id}")
        } else {
            let name = (id as i64 * 7919 + spec.seed as i64) % 100_000;
            format!("SELECT id, value FROM t WHERE name = 'name-{name:06}'")
        }
    };

    let plain_counts = Arc::new(CountingStore::new(LatencyStore::new(
        Arc::clone(&fs),
        latency,
    )));
    let lake_counts = Arc::new(CountingStore::new(LatencyStore::new(
        Arc::clone(&fs),
        latency,
    )));
    let lake = LakeCache::builder().build()?;

    let start = Instant::now();
    let plain = SessionContext::new_with_config(config());
    plain.register_object_store(&url, plain_counts.clone());
    plain
        .register_parquet("t", &table_url, ParquetReadOptions::default())
        .await?;
    let plain_register = start.elapsed();

    let start = Instant::now();
    let runtime = RuntimeEnvBuilder::new()
        .with_cache_manager(lake.cache_manager_config())
        .build_arc()?;
    let cached = SessionContext::new_with_config_rt(config(), runtime);
    cached.register_object_store(
        &url,
        Arc::new(CachingObjectStore::new_arc(
            lake_counts.clone(),
            &url,
            &lake,
        )),
    );
    let table = LakeTable::try_new(&cached.state(), &table_url, &lake).await?;
    cached.register_table("t", Arc::new(table))?;
    let lake_register = start.elapsed();

    let mut sides = [Side::default(), Side::default()];
    for q in 0..queries {
        let sql = sql(q);
        let mut answers = Vec::new();
        for (side, (ctx, counts)) in sides
            .iter_mut()
            .zip([(&plain, &plain_counts), (&cached, &lake_counts)])
        {
            counts.reset();
            let start = Instant::now();
            let rows: usize = ctx
                .sql(&sql)
                .await?
                .collect()
                .await?
                .iter()
                .map(|b| b.num_rows())
                .sum();
            let took = start.elapsed();
            answers.push(rows);
            if q < DISTINCT {
                side.cold += took;
            } else {
                side.warm += took;
                let r = count_reads(&counts.gets(), &index);
                side.warm_reads.footer += r.footer;
                side.warm_reads.page_index += r.page_index;
                side.warm_reads.bloom_filter += r.bloom_filter;
                side.warm_reads.data += r.data;
            }
        }
        assert_eq!(
            answers[0], answers[1],
            "both sides return the same rows: {sql}"
        );
    }
    let warm_queries = (queries - DISTINCT).max(1) as u32;
    let per = |r: u64| r as f64 / f64::from(warm_queries);
    println!(
        "{files} files x 8 row groups of 1,000 rows, {} ms per request, {queries} point lookups in one session\n",
        latency.as_millis()
    );
    println!(
        "| side | register ms | first round ms ({DISTINCT} queries) | warm query ms (mean) | warm GETs per query: footer / page index / bloom / data |"
    );
    println!("|---|---:|---:|---:|---|");
    for (name, side, register) in [
        ("DataFusion 55", &sides[0], plain_register),
        ("LakeTable", &sides[1], lake_register),
    ] {
        let r = &side.warm_reads;
        println!(
            "| {name} | {:.0} | {:.0} | {:.1} | {:.1} / {:.1} / {:.1} / {:.1} |",
            register.as_secs_f64() * 1e3,
            side.cold.as_secs_f64() * 1e3,
            (side.warm / warm_queries).as_secs_f64() * 1e3,
            per(r.footer),
            per(r.page_index),
            per(r.bloom_filter),
            per(r.data)
        );
    }
    println!(
        "\nwarm speed-up: {:.2}x",
        sides[0].warm.as_secs_f64() / sides[1].warm.as_secs_f64()
    );
    eprintln!("{:?}", lake.stats().index);
    Ok(())
}
