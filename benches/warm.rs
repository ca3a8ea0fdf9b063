//! Warm queries: what a query costs once everything it reads is cached, against vanilla
//! DataFusion over the same lake on the local disk (one session kept, its own caches on),
//! the speed a cached remote lake is held against.
//!
//! Sides, each one session registered once and warmed by running every query twice:
//! - vanilla over the lake on the local disk;
//! - lakecache over the remote lake, its bytes in the memory tier;
//! - lakecache over the remote lake, its bytes on the disk tier (the memory tier at its
//!   smallest, 1 MiB, so nearly every byte comes from disk);
//! - lakecache over the lake on the local disk (installing the caches on a local lake).
//!
//! The lake: `--files` (default 400) files of 5,000 rows, in memory as `s3://lake` behind 25 ms
//! per real request and one 1 Gbit/s link, and the same files on the local disk. The queries
//! are run in turn, one side after the other, `--runs` (default 15) times; each figure is the
//! median, with its ratio to vanilla on the local disk, and the requests the remote sides
//! sent during the timed runs (none, when everything is cached).
//!
//! `cargo bench --bench warm` (options: `-- --files N --runs N --side N --query N`, the last
//! two to run one side or one query alone, 1 to 4, for a profiler).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{arg, context, memory_lake, percentile, remote, run};
use datafusion::error::Result;
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::testkit::lake::{LakeSpec, write_lake};
use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use url::Url;

const QUERIES: [(&str, &str); 4] = [
    (
        "lookup",
        "SELECT count(*), round(sum(value), 3), min(name) FROM t \
         WHERE id BETWEEN 1000000 AND 1004999",
    ),
    ("point", "SELECT id, name, value FROM t WHERE id = 424242"),
    ("scan", "SELECT round(sum(value), 3) FROM t"),
    (
        "group-by",
        "SELECT category, count(*), round(sum(value), 3) FROM t GROUP BY category",
    ),
];

const SIDES: [&str; 4] = [
    "vanilla, local disk",
    "lakecache, memory",
    "lakecache, disk tier",
    "lakecache, local disk",
];

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let files = arg("--files", 400) as usize;
    let runs = arg("--runs", 15) as usize;
    let only = arg("--side", 0) as usize;
    // One query alone (1 to 4), for a profiler; 0 runs them all.
    let query = arg("--query", 0) as usize;
    let spec = LakeSpec::small_files(files);
    let (memory, lake_bytes) = memory_lake(&spec).await?;
    let store = remote(memory, Duration::from_millis(25), 125_000_000).await?;
    let local = tempfile::tempdir()?;
    write_lake(
        &LocalFileSystem::new(),
        &Path::from_absolute_path(local.path().join("lake"))?,
        &spec,
    )
    .await?;
    let local_url = format!("{}/", local.path().join("lake").display());
    let disk = tempfile::tempdir()?;
    println!(
        "{files} files, {:.1} MB; warm: every query run twice first; medians of {runs} runs",
        lake_bytes as f64 / 1e6
    );
    let mut sessions: Vec<(usize, SessionContext, Option<LakeCache>)> = Vec::new();
    for (n, side) in SIDES.into_iter().enumerate() {
        if only != 0 && only != n + 1 {
            continue;
        }
        let lake = match side {
            "lakecache, disk tier" => Some(
                LakeCache::builder()
                    .range_memory_bytes(1 << 20)
                    .range_disk(disk.path(), 4 * lake_bytes)
                    .build()?,
            ),
            s if s.starts_with("lakecache") => Some(LakeCache::builder().build()?),
            _ => None,
        };
        let ctx = context(lake.as_ref())?;
        let url = Url::parse("s3://lake").expect("static URL");
        ctx.register_object_store(&url, Arc::clone(&store) as Arc<dyn ObjectStore>);
        let table = match side.ends_with("local disk") {
            true => local_url.as_str(),
            false => "s3://lake/lake/",
        };
        ctx.register_parquet("t", table, ParquetReadOptions::default())
            .await?;
        for _ in 0..2 {
            for (_, sql) in QUERIES {
                run(&ctx, sql).await?;
            }
        }
        sessions.push((n, ctx, lake));
    }
    if let Some((_, _, Some(lake))) = sessions.iter().find(|(n, _, _)| *n == 2) {
        lake.flush().await;
    }
    store.reset();
    let mut times = vec![vec![Vec::new(); sessions.len()]; QUERIES.len()];
    for _ in 0..runs {
        for (q, (_, sql)) in QUERIES.iter().enumerate() {
            if query != 0 && query != q + 1 {
                continue;
            }
            for (s, (_, ctx, _)) in sessions.iter().enumerate() {
                times[q][s].push(run(ctx, sql).await?.1);
            }
        }
    }
    let base = sessions.iter().position(|(n, _, _)| *n == 0);
    for (q, (name, _)) in QUERIES.iter().enumerate() {
        if times[q][0].is_empty() {
            continue;
        }
        let mut line = format!("  {name:<9}");
        let reference = base.map(|b| percentile(&times[q][b], 50.0));
        for (s, (n, _, _)) in sessions.iter().enumerate() {
            let median = percentile(&times[q][s], 50.0);
            line += &format!(" | {} {median:>6.2} ms", SIDES[*n]);
            if let Some(reference) = reference.filter(|_| *n != 0) {
                line += &format!(" ({:.2}x)", median / reference);
            }
        }
        println!("{line}");
    }
    let c = store.counts();
    println!(
        "  requests to the remote store during the timed runs: HEAD/LIST/GET {}/{}/{}",
        c.head, c.list, c.get
    );
    for (n, _, lake) in &sessions {
        if let Some(lake) = lake {
            let r = lake.stats().range;
            println!(
                "  {}: bytes from memory {:.1} MB, disk {:.1} MB, store {:.1} MB",
                SIDES[*n],
                r.bytes_from_memory as f64 / 1e6,
                r.bytes_from_disk as f64 / 1e6,
                r.bytes_from_store as f64 / 1e6,
            );
        }
    }
    Ok(())
}
