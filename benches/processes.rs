//! One host, many processes: N processes sharing one disk tier directory.
//!
//! `scans`: for N = 1, 2, 4 and 8, N processes (this binary, run again as workers) start the
//! same cold scan at once, each over its own simulated remote store holding the same seeded
//! lake (S3's e_tags, 25 ms median log-normal per real request with a 1% tail, 1 Gbit/s),
//! with one `LakeCache` whose disk tier is the shared directory; then N new processes run it
//! warm (their memory empty, the directory filled). Reported per N: the requests all the
//! processes sent, the bytes on disk, and the slowest process's time, against one process.
//!
//! `open`: `LakeCache::build()` over a directory of 100,000 and 1,000,000 entries (tiny files
//! in the tier's layout): its time and the heap it keeps, first over a directory an earlier
//! release filled (no ledger: counted by the first write, whose walk is timed too), then
//! over the counted one.
//!
//! `cargo bench --bench processes` (options: `-- --scenario scans|open --files N
//! --entries 100000,1000000`).

mod common;

use std::path::{Path as FsPath, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{arg, context, memory_lake, ms, remote_s3_like, run, text};
use datafusion::error::{DataFusionError, Result};
use datafusion::prelude::ParquetReadOptions;
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::testkit::lake::LakeSpec;
use object_store::ObjectStore;
use url::Url;

#[global_allocator]
static HEAP: common::CountingHeap = common::CountingHeap;

const SQL: &str = "SELECT category, count(*), sum(id), max(value) FROM t GROUP BY category";
const LATENCY: Duration = Duration::from_millis(25);
const BANDWIDTH: u64 = 125_000_000;

fn fail(what: impl std::fmt::Display) -> DataFusionError {
    DataFusionError::Execution(what.to_string())
}

/// A worker: the scan over the lake with the disk tier in `dir`; prints its figures.
async fn worker(dir: &FsPath, files: usize) -> Result<()> {
    let (lake, _) = memory_lake(&LakeSpec::small_files(files)).await?;
    let store = remote_s3_like(lake, LATENCY, BANDWIDTH, std::process::id() as u64).await?;
    let began = Instant::now();
    let cache = LakeCache::builder().range_disk(dir, 16 << 30).build()?;
    let ctx = context(Some(&cache))?;
    let url = Url::parse("s3://lake").map_err(fail)?;
    ctx.register_object_store(&url, Arc::clone(&store) as Arc<dyn ObjectStore>);
    ctx.register_parquet("t", "s3://lake/lake/", ParquetReadOptions::default())
        .await?;
    let (rows, _) = run(&ctx, SQL).await?;
    let took = began.elapsed();
    cache.flush().await;
    let counts = store.counts();
    println!(
        "WORKER requests={} ms={:.1} rows={rows} claims_waited={} heads={} gets={} lists={}",
        counts.total(),
        ms(took),
        cache.stats().range.disk_claims_waited,
        counts.head,
        counts.get,
        counts.list
    );
    Ok(())
}

/// What one worker printed.
struct Figures {
    requests: u64,
    gets: u64,
    heads: u64,
    ms: f64,
    rows: u64,
    waited: u64,
}

fn figure(line: &str, name: &str) -> Option<f64> {
    let at = line.find(&format!("{name}="))? + name.len() + 1;
    line[at..].split_whitespace().next()?.parse().ok()
}

/// Runs `n` workers at once over `dir`; their figures.
fn workers(n: usize, dir: &FsPath, files: u64) -> Result<Vec<Figures>> {
    let me = std::env::current_exe()?;
    let children: Vec<_> = (0..n)
        .map(|_| {
            Command::new(&me)
                .args(["--worker", &dir.display().to_string()])
                .args(["--files", &files.to_string()])
                .stdout(Stdio::piped())
                .spawn()
        })
        .collect::<std::io::Result<_>>()?;
    children
        .into_iter()
        .map(|child| {
            let out = child.wait_with_output()?;
            let stdout = String::from_utf8_lossy(&out.stdout);
            let line = stdout
                .lines()
                .find(|l| l.starts_with("WORKER"))
                .ok_or_else(|| fail(format!("a worker failed: {stdout}")))?;
            let get = |name| figure(line, name).ok_or_else(|| fail(line.to_string()));
            Ok(Figures {
                requests: get("requests")? as u64,
                gets: get("gets")? as u64,
                heads: get("heads")? as u64,
                ms: get("ms")?,
                rows: get("rows")? as u64,
                waited: get("claims_waited")? as u64,
            })
        })
        .collect()
}

/// Bytes of the files below `dir`.
fn bytes_below(dir: &FsPath) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        match e.file_type() {
            Ok(t) if t.is_dir() => total += bytes_below(&e.path()),
            Ok(t) if t.is_file() => total += e.metadata().map_or(0, |m| m.len()),
            _ => {}
        }
    }
    total
}

fn scans(files: u64) -> Result<()> {
    println!(
        "{files} files of 5,000 rows per process; 25 ms median per request with a 1% tail; \
         one LakeCache per process, one disk directory for all"
    );
    let mut alone = None;
    for n in [1, 2, 4, 8] {
        let dir = tempfile::tempdir()?;
        let cold = workers(n, dir.path(), files)?;
        let on_disk = bytes_below(dir.path());
        let warm = workers(n, dir.path(), files)?;
        let rows = cold[0].rows;
        assert!(
            cold.iter().chain(&warm).all(|f| f.rows == rows),
            "every process's rows"
        );
        let sum = |f: &[Figures]| f.iter().map(|f| f.requests).sum::<u64>();
        let slowest = |f: &[Figures]| f.iter().map(|f| f.ms).fold(0.0, f64::max);
        let (cold_req, warm_req) = (sum(&cold), sum(&warm));
        let (cold_ms, warm_ms) = (slowest(&cold), slowest(&warm));
        let (one_req, one_ms) = *alone.get_or_insert((cold_req, cold_ms));
        let waited: u64 = cold.iter().map(|f| f.waited).sum();
        let gets: u64 = cold.iter().map(|f| f.gets).sum();
        let heads: u64 = cold.iter().map(|f| f.heads).sum();
        let (warm_gets, warm_heads): (u64, u64) = (
            warm.iter().map(|f| f.gets).sum(),
            warm.iter().map(|f| f.heads).sum(),
        );
        println!(
            "RESULT processes={n} cold_requests={cold_req} ({:.2}x one process's: \
             {gets} GETs, {heads} HEADs) cold_slowest_ms={cold_ms:.0} ({:.2}x) \
             waited_for_another={waited} disk_mib={:.1} warm_requests={warm_req} \
             ({warm_gets} GETs, {warm_heads} HEADs) warm_slowest_ms={warm_ms:.0}",
            cold_req as f64 / one_req as f64,
            cold_ms / one_ms,
            on_disk as f64 / (1 << 20) as f64,
        );
    }
    Ok(())
}

/// Fills `root` (a tier's directory) with `entries` tiny entry files in its layout, ten per
/// object.
fn fill(root: &FsPath, entries: u64) -> Result<()> {
    std::fs::create_dir_all(root.join("tmp"))?;
    std::fs::write(
        root.join("FORMAT"),
        "lakecache range cache, entry format LKRANGE1\n",
    )?;
    let body = [0u8; 100];
    for i in 0..entries {
        let object = 0x1000_0000_0000_0000u64 + i / 10;
        let sub = root.join(format!("{object:016x}"));
        if i % 10 == 0 {
            std::fs::create_dir(&sub)?;
        }
        let name = format!(
            "{object:016x}-{:016x}-{}-{}.range",
            7u64,
            (i % 10) * 100,
            100
        );
        std::fs::write(sub.join(name), body)?;
    }
    Ok(())
}

async fn open(sizes: &[u64]) -> Result<()> {
    let (lake, _) = memory_lake(&LakeSpec::small_files(4)).await?;
    let store = remote_s3_like(lake, Duration::from_millis(1), BANDWIDTH, 1).await?;
    for &entries in sizes {
        let dir = tempfile::tempdir()?;
        let root: PathBuf = dir.path().join("lakecache-ranges");
        let began = Instant::now();
        fill(&root, entries)?;
        let filled = began.elapsed();
        for counted in [false, true] {
            let heap = common::heap_live_mib();
            let began = Instant::now();
            let cache = LakeCache::builder()
                .range_disk(dir.path(), 16 << 30)
                .build()?;
            let build = began.elapsed();
            let kept = common::heap_live_mib() - heap;
            // A scan whose ranges are written: the first write counts an uncounted directory.
            let ctx = context(Some(&cache))?;
            let url = Url::parse("s3://lake").map_err(fail)?;
            ctx.register_object_store(&url, Arc::clone(&store) as Arc<dyn ObjectStore>);
            ctx.register_parquet("t", "s3://lake/lake/", ParquetReadOptions::default())
                .await?;
            let began = Instant::now();
            run(&ctx, SQL).await?;
            cache.flush().await;
            let written = began.elapsed();
            let stats = cache.stats().range;
            println!(
                "RESULT entries={entries} ledger={} build_ms={:.2} build_heap_kib={:.0} \
                 scan_and_writes_ms={:.0} walks={} entries_counted={} (filled in {:.0} s)",
                if counted {
                    "counted"
                } else {
                    "none (earlier release)"
                },
                ms(build),
                kept * 1024.0,
                ms(written),
                stats.disk_walks,
                stats.disk.entries,
                filled.as_secs_f64()
            );
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let files = arg("--files", 100);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if let Some(dir) = text("--worker") {
        return runtime.block_on(worker(FsPath::new(&dir), files as usize));
    }
    let sizes: Vec<u64> = text("--entries")
        .unwrap_or_else(|| "100000,1000000".into())
        .split(',')
        .map(|s| s.parse().map_err(fail))
        .collect::<Result<_>>()?;
    match text("--scenario").as_deref() {
        Some("scans") => scans(files),
        Some("open") => runtime.block_on(open(&sizes)),
        _ => {
            scans(files)?;
            runtime.block_on(open(&sizes))
        }
    }
}
