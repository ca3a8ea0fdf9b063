//! The handle-cache benchmark: the Gluten file-handle workload (200 small Parquet files, 10
//! repeated scans: full, filtered, two-column projection), cache off against cache on, on a
//! local directory and on a simulated remote store charging 25 ms per request.
//!
//! `cargo bench --bench handle` (options: `-- --files N --runs N --latency-ms MS`). Each
//! scan runs in a new `SessionContext`; off and on alternate run by run so drift in a shared
//! machine's speed hits both alike. Prints a Markdown table for docs/benchmarks.md.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::arg;
use datafusion::prelude::SessionConfig;
use datafusion_lakecache::testkit::lake::{LakeSpec, SCANS, write_lake};
use datafusion_lakecache::testkit::{CountingStore, LakeLocation, LatencyStore, query};
use datafusion_lakecache::{CachingObjectStore, LakeCache};
use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use url::Url;

struct Totals {
    off: Duration,
    on: Duration,
    warm_head_list_off: u64,
    warm_head_list_on: u64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> datafusion::error::Result<()> {
    let files = arg("--files", 200) as usize;
    let runs = arg("--runs", 10) as usize;
    let latency = Duration::from_millis(arg("--latency-ms", 25));
    let dir = tempfile::tempdir()?;
    let fs = Arc::new(LocalFileSystem::new());
    write_lake(
        fs.as_ref(),
        &Path::from_absolute_path(dir.path().join("lake"))?,
        &LakeSpec::small_files(files),
    )
    .await?;
    let url = Url::parse("file://").expect("static URL");
    let table_url = format!("{}/", dir.path().join("lake").display());
    let at = |store: Arc<dyn ObjectStore>| LakeLocation {
        store_url: url.clone(),
        store,
        table_url: table_url.clone(),
        lake: None,
    };

    println!("{files} files x 5,000 rows, {runs} scans per query, each in a new SessionContext\n");
    println!(
        "| store | query | cache off ms | cache on ms | off / on | HEAD+LIST per warm scan, off / on |"
    );
    println!("|---|---|---:|---:|---:|---:|");
    for simulated in [false, true] {
        let lake = LakeCache::builder().build()?;
        let off_counts = Arc::new(CountingStore::new(LatencyStore::new(
            Arc::clone(&fs),
            if simulated { latency } else { Duration::ZERO },
        )));
        let on_counts = Arc::new(CountingStore::new(LatencyStore::new(
            Arc::clone(&fs),
            if simulated { latency } else { Duration::ZERO },
        )));
        let (off, on): (Arc<dyn ObjectStore>, Arc<dyn ObjectStore>) = if simulated {
            (
                off_counts.clone(),
                Arc::new(CachingObjectStore::new_arc(on_counts.clone(), &url, &lake)),
            )
        } else {
            // The real local store on both sides, so descriptor reuse is what is compared.
            (
                fs.clone(),
                Arc::new(CachingObjectStore::new_arc(Arc::clone(&fs), &url, &lake)),
            )
        };
        let store_name = if simulated {
            format!("simulated {} ms", latency.as_millis())
        } else {
            "local disk".into()
        };
        for (name, sql) in SCANS {
            let mut t = Totals {
                off: Duration::ZERO,
                on: Duration::ZERO,
                warm_head_list_off: 0,
                warm_head_list_on: 0,
            };
            for run in 0..runs {
                for (store, counts, total, warm) in [
                    (&off, &off_counts, &mut t.off, &mut t.warm_head_list_off),
                    (&on, &on_counts, &mut t.on, &mut t.warm_head_list_on),
                ] {
                    counts.reset();
                    let start = Instant::now();
                    query(&at(Arc::clone(store)), sql, SessionConfig::new()).await?;
                    *total += start.elapsed();
                    let c = counts.counts();
                    if run > 0 {
                        *warm += c.head + c.list;
                    }
                }
            }
            let warm_scans = (runs.max(2) - 1) as u64;
            let head_list = if simulated {
                format!(
                    "{} / {}",
                    t.warm_head_list_off / warm_scans,
                    t.warm_head_list_on / warm_scans
                )
            } else {
                "n/a (not counted)".into()
            };
            println!(
                "| {store_name} | {name} | {:.0} | {:.0} | {:.2} | {head_list} |",
                t.off.as_secs_f64() * 1e3,
                t.on.as_secs_f64() * 1e3,
                t.off.as_secs_f64() / t.on.as_secs_f64(),
            );
        }
        let s = lake.stats().handle;
        eprintln!("{store_name}: {s:?}");
    }
    Ok(())
}
