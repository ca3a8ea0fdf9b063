//! Bigger than the cache: a lake four times the range cache's memory, queried by a skewed
//! (Zipf) mix of one-file lookups with an occasional full scan, by vanilla DataFusion, by
//! lakecache with the memory tier alone, and by lakecache with memory and a disk tier.
//! Figures: each side's time over the mix, its per-lookup percentiles, the memory tier's hit
//! rate, where the bytes came from (memory, disk, store), and the time of the lookups that
//! sent no request to the store (served by the caches alone). Vanilla also runs the mix over
//! the same lake on the local disk: the speed the disk tier is held against.
//!
//! The lake: `--files` (default 400) files of 5,000 rows (about 100 MB) in memory as
//! `s3://lake`, behind 25 ms per real request (below range coalescing) and one 1 Gbit/s link.
//! The range cache's memory is a quarter of the lake. Each lookup reads two columns of one file
//! (the `id` range of a file drawn by Zipf with exponent `--zipf` / 100, default 1.1, over a
//! fixed shuffle of the files); every `--scan-every` (default 50) queries a full scan reads one
//! column of every file.
//! Footers are read at registration with a 64 KiB `metadata_size_hint` (so small files are not
//! read whole there); each side registers once and then runs the `--queries` (default 300)
//! queries in the same order.
//! `cargo bench --bench zipf` (options: `-- --files N --queries N --zipf N --scan-every N
//! --side N`, the last to run one side alone, 1 to 4, for a profiler).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{arg, context, memory_lake, ms, percentile, remote, run};
use datafusion::error::Result;
use datafusion::prelude::ParquetReadOptions;
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::testkit::lake::{LakeSpec, write_lake};
use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use url::Url;

const ROWS: usize = 5_000;

/// The queries of the mix, in order: a lookup of one file's ids, or a full scan.
fn mix(files: usize, queries: usize, exponent: f64, scan_every: usize) -> Vec<String> {
    let mut rng = SmallRng::seed_from_u64(11);
    let mut order: Vec<usize> = (0..files).collect();
    order.shuffle(&mut rng);
    // Cumulative Zipf weights of the ranks 1..=files.
    let mut cdf = Vec::with_capacity(files);
    let mut total = 0.0;
    for rank in 1..=files {
        total += 1.0 / (rank as f64).powf(exponent);
        cdf.push(total);
    }
    (1..=queries)
        .map(|q| {
            if scan_every > 0 && q % scan_every == 0 {
                return "SELECT round(sum(value), 3) FROM t".to_string();
            }
            let x = rng.random_range(0.0..total);
            let rank = cdf.partition_point(|&c| c < x).min(files - 1);
            let lo = order[rank] * ROWS;
            format!(
                "SELECT count(*), round(sum(value), 3), min(name) FROM t \
                 WHERE id BETWEEN {lo} AND {}",
                lo + ROWS - 1
            )
        })
        .collect()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let files = arg("--files", 400) as usize;
    let queries = arg("--queries", 300) as usize;
    let exponent = arg("--zipf", 110) as f64 / 100.0;
    let scan_every = arg("--scan-every", 50) as usize;
    // One side alone (1 to 4, in the order below), for a profiler; 0 runs them all.
    let only = arg("--side", 0) as usize;
    let (memory, lake_bytes) = memory_lake(&LakeSpec::small_files(files)).await?;
    let cache_bytes = (lake_bytes / 4).max(1 << 20);
    let store = remote(memory, Duration::from_millis(25), 125_000_000).await?;
    let mix = mix(files, queries, exponent, scan_every);
    println!(
        "{files} files, {:.1} MB; range memory {:.1} MB (a quarter); {queries} queries, Zipf \
         {exponent}, a full scan every {scan_every}; 25 ms per request, one 1 Gbit/s link",
        lake_bytes as f64 / 1e6,
        cache_bytes as f64 / 1e6
    );
    let disk = tempfile::tempdir()?;
    // The same lake on the local disk, for vanilla: the speed the disk tier is held against.
    let local = tempfile::tempdir()?;
    let local_fs = LocalFileSystem::new();
    let local_prefix = Path::from_absolute_path(local.path().join("lake"))?;
    write_lake(&local_fs, &local_prefix, &LakeSpec::small_files(files)).await?;
    let local_url = format!("{}/", local.path().join("lake").display());
    let sides = [
        "vanilla",
        "vanilla, local disk",
        "lakecache, memory",
        "lakecache, memory + disk",
    ];
    for (n, side) in sides.into_iter().enumerate() {
        if only != 0 && only != n + 1 {
            continue;
        }
        let mut builder = LakeCache::builder().range_memory_bytes(cache_bytes);
        if side.ends_with("disk") {
            builder = builder.range_disk(disk.path(), 4 * lake_bytes);
        }
        let lake = builder.build()?;
        let vanilla = side.starts_with("vanilla");
        let ctx = context((!vanilla).then_some(&lake))?;
        let table = match side {
            "vanilla, local disk" => local_url.as_str(),
            _ => "s3://lake/lake/",
        };
        let url = Url::parse("s3://lake").expect("static URL");
        ctx.register_object_store(&url, Arc::clone(&store) as Arc<dyn ObjectStore>);
        ctx.sql("SET datafusion.execution.parquet.metadata_size_hint = 65536")
            .await?;
        ctx.register_parquet("t", table, ParquetReadOptions::default())
            .await?;
        store.reset();
        let before = lake.stats().range;
        let (mut lookups, mut scans) = (Vec::new(), Vec::new());
        // Lookups that sent no request to the store: served by a cache (or the local disk).
        let mut unsent = Vec::new();
        for sql in &mix {
            let sent = store.counts().get;
            let (_, took) = run(&ctx, sql).await?;
            match sql.contains("BETWEEN") {
                true => {
                    lookups.push(took);
                    if store.counts().get == sent {
                        unsent.push(took);
                    }
                }
                false => scans.push(took),
            }
        }
        let r = lake.stats().range;
        let (hits, misses) = (
            r.memory.hits - before.memory.hits,
            r.memory.misses - before.memory.misses,
        );
        let total: Duration = lookups.iter().chain(&scans).sum();
        println!(
            "{side:<26} total {:>8.1} ms | lookups p50 {:>6.1} p90 {:>6.1} p99 {:>6.1} ms | \
             scans mean {:>7.1} ms | HEAD/LIST/GET {}/{}/{}, {:.1} MB from the store",
            ms(total),
            percentile(&lookups, 50.0),
            percentile(&lookups, 90.0),
            percentile(&lookups, 99.0),
            ms(scans.iter().sum::<Duration>()) / scans.len().max(1) as f64,
            store.counts().head,
            store.counts().list,
            store.counts().get,
            store.bytes() as f64 / 1e6,
        );
        if !unsent.is_empty() {
            println!(
                "{:<26} {} lookups sent no request: p50 {:.1} p90 {:.1} ms",
                "",
                unsent.len(),
                percentile(&unsent, 50.0),
                percentile(&unsent, 90.0),
            );
        }
        if !vanilla {
            println!(
                "{:<26} memory hit rate {:.1}% ({hits} of {}), bytes from memory {:.1} MB, \
                 disk {:.1} MB, store {:.1} MB; memory holds {:.1} of {:.1} MB",
                "",
                100.0 * hits as f64 / (hits + misses).max(1) as f64,
                hits + misses,
                (r.bytes_from_memory - before.bytes_from_memory) as f64 / 1e6,
                (r.bytes_from_disk - before.bytes_from_disk) as f64 / 1e6,
                (r.bytes_from_store - before.bytes_from_store) as f64 / 1e6,
                r.memory_bytes as f64 / 1e6,
                r.memory_capacity as f64 / 1e6,
            );
        }
    }
    Ok(())
}
