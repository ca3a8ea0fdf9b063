//! Scale: how each cost grows with the lake, its users and its writers, vanilla DataFusion
//! beside the caches where it applies. Every run is a child process of its own (this binary,
//! called again), so the peak RSS it reports is that run's alone.
//!
//! The store: tiny Parquet files (one row group of 10 rows) in memory behind
//! `LatencyStore::s3_like` (a log-normal body of waits around `--latency-ms`, default 2 ms,
//! and one request in a hundred 20 times longer), charged once per real request, counted.
//!
//! Scenarios (`--scenario NAME` runs one; all by default):
//! - `files`: a table of `--files` (default 10000,100000) objects: `CREATE EXTERNAL TABLE`,
//!   then warm planning of `SELECT count(*)` (answered from statistics), that query, and a
//!   scan of every file's data (`sum`), each as the median of 3 once warm (of `--plan-runs`
//!   for planning: more, to profile it; the child says on stderr when registration is done,
//!   to attach a profiler then); requests of each.
//!   Vanilla's data scan runs up to `--vanilla-scan-files` (default 100000) files: past
//!   that, its one request per file at a time takes hours; the caches' up to `--scan-files`
//!   (default: any), since DataFusion's own state of a scan of a million files takes about
//!   16 GB.
//! - `identities`: `--identities` (default 10,100,1000) store instances over one lake of
//!   `--identity-files` (default 2000) files whose e_tags are digests, each registering the
//!   table and running the scan in turn over one `LakeCache`: time and requests per
//!   identity, and the memory they leave.
//! - `concurrent`: `--queries` (default 64) sessions of one store at once over a warm lake of
//!   2,000 files, against one session's time.
//! - `rewrites`: `--rewrites` (default 100000) objects written through the wrapper (each
//!   write forgets what the caches held of the object), then a warm scan of 2,000 files.
//! - `memory`: `--memory-files` (default 2000) files of about 64 KiB scanned cold, then warm:
//!   the peak RSS, and of it what the range cache holds.
//! - `entries`: `--entries` (default 1000000) objects listed and read through the wrapper:
//!   the handle cache's bytes per object, and what a second store identity adds.
//!
//! Files are named `lake/f0000042.parquet`; `--spark-names 1` names them as Spark does
//! (`lake/part-00042-<a UUID>.c000.snappy.parquet`, 72 characters), for what longer paths cost.
//!
//! `cargo bench --bench scale` (options above, and `--modes vanilla,cached`; the figures in
//! docs/benchmarks.md, "Scale"). `LAKECACHE_*` variables set the caches' settings, for a
//! sizing run; the figures reported are of the defaults.

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{heap_live_mib, list, ms, peak_rss_mib, text};

/// Counts the live heap, to tell what a run holds from what the allocator keeps (RSS).
#[global_allocator]
static HEAP: common::CountingHeap = common::CountingHeap;
use datafusion::arrow::array::{Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::error::Result;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_lakecache::testkit::{ContentETags, CountingStore, LatencyStore, RequestCounts};
use datafusion_lakecache::{CachingObjectStore, LakeCache, testkit};
use futures::StreamExt;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use parquet::arrow::ArrowWriter;
use url::Url;

const URL: &str = "s3://lake";
const TABLE: &str = "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION 's3://lake/lake/'";
const COUNT: &str = "SELECT count(*) FROM t";
const SCAN: &str = "SELECT sum(v) FROM t";

/// One tiny Parquet file: 10 rows of `id` and `v`, one row group, with statistics.
fn tiny_file() -> Bytes {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("v", DataType::Int64, false),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from_iter_values(0..10)),
            Arc::new(Int64Array::from_iter_values(100..110)),
        ],
    )
    .expect("a batch of two columns");
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, schema, None).expect("a writer");
    writer.write(&batch).expect("written");
    writer.close().expect("closed");
    out.into()
}

/// One Parquet file of about 64 KiB: 3,400 rows of `id` and `v` (values that do not
/// compress), one row group.
fn sized_file() -> Bytes {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("v", DataType::Int64, false),
    ]));
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let noise = (0..3_400).map(|_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % 1_000_000) as i64
    });
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from_iter_values(0..3_400)),
            Arc::new(Int64Array::from_iter_values(noise)),
        ],
    )
    .expect("a batch of two columns");
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, schema, None).expect("a writer");
    writer.write(&batch).expect("written");
    writer.close().expect("closed");
    out.into()
}

/// A lake of `files` copies of one tiny file under `lake/` (one buffer, shared: the store
/// holds little more than its names).
async fn lake(files: u64) -> Arc<InMemory> {
    lake_of(files, tiny_file()).await
}

/// The path of file `i` of the lake: `lake/f0000042.parquet` (21 characters), or with
/// `--spark-names 1` a name as Spark writes them, 72 characters with `lake/`
/// (`part-00042-<a UUID>.c000.snappy.parquet`), for what longer paths cost.
fn file_path(i: u64) -> Path {
    match common::arg("--spark-names", 0) {
        0 => Path::from(format!("lake/f{i:07}.parquet")),
        _ => {
            let h = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let uuid = format!(
                "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
                h >> 32,
                (h >> 16) & 0xffff,
                h & 0xfff,
                (h >> 20) & 0xfff,
                i
            );
            Path::from(format!("lake/part-{i:05}-{uuid}.c000.snappy.parquet"))
        }
    }
}

/// A lake of `files` copies of `bytes` under `lake/`, one buffer shared.
async fn lake_of(files: u64, bytes: Bytes) -> Arc<InMemory> {
    let store = Arc::new(InMemory::new());
    for i in 0..files {
        let path = file_path(i);
        store
            .put(&path, PutPayload::from_bytes(bytes.clone()))
            .await
            .expect("in memory");
    }
    store
}

type Counted = CountingStore<Arc<dyn ObjectStore>>;

/// `store` behind S3-like waits, counted.
fn remote(store: Arc<dyn ObjectStore>) -> Arc<Counted> {
    let latency = Duration::from_millis(common::arg("--latency-ms", 2));
    let slow: Arc<dyn ObjectStore> = Arc::new(LatencyStore::s3_like(store, latency, 7));
    Arc::new(CountingStore::new(slow))
}

fn session(lake: Option<&LakeCache>, store: Arc<dyn ObjectStore>) -> Result<SessionContext> {
    let ctx = testkit::context(lake, SessionConfig::new().with_target_partitions(2))?;
    ctx.register_object_store(&Url::parse(URL).expect("static"), store);
    Ok(ctx)
}

/// Runs `sql` to its end; the time it took.
async fn timed(ctx: &SessionContext, sql: &str) -> Result<Duration> {
    let began = Instant::now();
    ctx.sql(sql).await?.collect().await?;
    Ok(began.elapsed())
}

/// The median of `runs` runs of `f`, and the requests each made (the last run's).
async fn median<F, Fut>(counted: &Counted, runs: usize, mut f: F) -> Result<(f64, RequestCounts)>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Duration>>,
{
    let mut times = Vec::new();
    let mut requests = RequestCounts::default();
    for _ in 0..runs {
        counted.reset();
        times.push(f().await?);
        requests = counted.counts();
    }
    times.sort();
    Ok((ms(times[times.len() / 2]), requests))
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn shown(r: &RequestCounts) -> String {
    format!("{}/{}/{}", r.head, r.get, r.list)
}

/// One run of a scenario in this process; prints `RESULT` lines for the parent.
async fn child(scenario: &str, mode: &str, size: u64) -> Result<()> {
    let cached = mode == "cached";
    // The defaults, or `LAKECACHE_*` settings of the environment (for a sizing run).
    let lake_cache = cached.then(|| LakeCache::builder().with_env().build().expect("settings"));
    match scenario {
        "files" => {
            let store = lake(size).await;
            let base = peak_rss_mib();
            let heap_base = heap_live_mib();
            let counted = remote(store);
            let ctx = session(lake_cache.as_ref(), counted.clone())?;
            // Said on stderr, as the end of registration is, to profile registration alone.
            eprintln!("registering {size} files");
            let began = Instant::now();
            ctx.sql(TABLE).await?;
            let register = (ms(began.elapsed()), counted.counts());
            let after_register = peak_rss_mib();
            eprintln!("registered {size} files");
            // Once, to warm what planning and the scans keep.
            timed(&ctx, COUNT).await?;
            let plan_runs = common::arg("--plan-runs", 3) as usize;
            let plan = median(&counted, plan_runs, || async {
                let began = Instant::now();
                ctx.sql(COUNT).await?.create_physical_plan().await?;
                Ok(began.elapsed())
            })
            .await?;
            let count = median(&counted, 3, || timed(&ctx, COUNT)).await?;
            let after_count = peak_rss_mib();
            let limit = match cached {
                true => common::arg("--scan-files", u64::MAX),
                false => common::arg("--vanilla-scan-files", 100_000),
            };
            let scan = match size <= limit {
                true => {
                    counted.reset();
                    let cold = (ms(timed(&ctx, SCAN).await?), counted.counts());
                    let warm = median(&counted, 3, || timed(&ctx, SCAN)).await?;
                    Some((cold, warm))
                }
                false => None,
            };
            let peak = peak_rss_mib();
            let heap = heap_live_mib() - heap_base;
            let per_file = |ms: f64| ms * 1000.0 / size as f64;
            // DataFusion's own statistics cache: how many files' statistics it holds, and
            // their bytes (`lakecache.index.datafusion_statistics` bounds it when installed).
            let statistics = ctx.runtime_env().cache_manager.get_file_statistic_cache();
            let (held, bytes) = statistics.map_or((0, 0), |c| {
                let entries = c.list_entries();
                (
                    entries.len(),
                    entries.values().map(|e| e.size_bytes).sum::<usize>(),
                )
            });
            println!(
                "RESULT files {size} {mode}: register {:.0} ms ({:.1} us/file, H/G/L {}), \
                 warm plan {:.1} ms ({:.2} us/file, {}), count(*) {:.1} ms ({:.2} us/file, {}), \
                 scan {}, rss base {base:.0} MiB, peak after registration +{:.0}, after \
                 count(*) +{:.0}, at the end +{:.0} MiB; heap live at the end +{heap:.0} MiB \
                 ({:.1} KiB/file), of which the index cache {:.0} MiB, listings {:.0} MiB and \
                 DataFusion's statistics cache {:.0} MiB ({held} files, {} bytes each)",
                register.0,
                per_file(register.0),
                shown(&register.1),
                plan.0,
                per_file(plan.0),
                shown(&plan.1),
                count.0,
                per_file(count.0),
                shown(&count.1),
                match scan {
                    Some(((cold, cold_r), (warm, warm_r))) => format!(
                        "cold {cold:.0} ms ({}) warm {warm:.1} ms ({:.2} us/file, {})",
                        shown(&cold_r),
                        per_file(warm),
                        shown(&warm_r)
                    ),
                    None => "not run".to_string(),
                },
                after_register - base,
                after_count - base,
                peak - base,
                heap * 1024.0 / size as f64,
                mib(lake_cache.as_ref().map_or(0, |l| l.stats().index.bytes)),
                mib(lake_cache
                    .as_ref()
                    .map_or(0, |l| l.stats().handle.listing_bytes)),
                mib(bytes as u64),
                bytes.checked_div(held).unwrap_or(0),
            );
        }
        "identities" => {
            let files = common::arg("--identity-files", 2_000);
            let store = ContentETags::new(Arc::try_unwrap(lake(files).await).expect("one owner"));
            store.learn(None).await?;
            let counted = remote(Arc::new(store));
            let base = peak_rss_mib();
            let mut times = Vec::new();
            let mut requests = RequestCounts::default();
            for i in 0..size {
                // A store instance of its own per identity, over the same backend.
                let own = Arc::new(PrefixStore::new(
                    counted.clone() as Arc<dyn ObjectStore>,
                    Path::default(),
                ));
                let ctx = session(lake_cache.as_ref(), own)?;
                counted.reset();
                let began = Instant::now();
                ctx.sql(TABLE).await?;
                ctx.sql(SCAN).await?.collect().await?;
                if i > 0 {
                    times.push(began.elapsed());
                    requests = requests + counted.counts();
                }
            }
            times.sort();
            let later = size.saturating_sub(1).max(1);
            println!(
                "RESULT identities {size} {mode}: each after the first: median {:.1} ms, \
                 requests H/G/L {:.1}/{:.1}/{:.1} per identity; rss +{:.0} MiB ({:.1} KiB per \
                 identity)",
                ms(times.get(times.len() / 2).copied().unwrap_or_default()),
                requests.head as f64 / later as f64,
                requests.get as f64 / later as f64,
                requests.list as f64 / later as f64,
                peak_rss_mib() - base,
                (peak_rss_mib() - base) * 1024.0 / size as f64,
            );
        }
        "concurrent" => {
            let counted = remote(lake(2_000).await);
            let store: Arc<dyn ObjectStore> = counted.clone();
            let ctx = session(lake_cache.as_ref(), Arc::clone(&store))?;
            ctx.sql(TABLE).await?;
            timed(&ctx, SCAN).await?;
            let one = median(&counted, 3, || timed(&ctx, SCAN)).await?;
            let mut sessions = Vec::new();
            for _ in 0..size {
                let ctx = session(lake_cache.as_ref(), Arc::clone(&store))?;
                ctx.sql(TABLE).await?;
                sessions.push(ctx);
            }
            counted.reset();
            let began = Instant::now();
            futures::future::try_join_all(sessions.iter().map(|ctx| timed(ctx, SCAN))).await?;
            let all = ms(began.elapsed());
            println!(
                "RESULT concurrent {size} {mode}: one scan {:.1} ms, {size} at once {all:.0} ms \
                 ({:.2}x of {size} one after another), requests {}",
                one.0,
                all / (one.0 * size as f64),
                shown(&counted.counts())
            );
        }
        "rewrites" => {
            let store = lake(2_000).await;
            let counted = remote(store.clone());
            let Some(lake_cache) = lake_cache else {
                println!("RESULT rewrites {size} vanilla: not applicable");
                return Ok(());
            };
            let url = Url::parse(URL).expect("static");
            let wrapped = Arc::new(CachingObjectStore::new_arc(
                counted.clone(),
                &url,
                &lake_cache,
            ));
            let ctx = session(Some(&lake_cache), wrapped.clone())?;
            ctx.sql(TABLE).await?;
            timed(&ctx, SCAN).await?;
            let before = median(&counted, 3, || timed(&ctx, SCAN)).await?;
            let began = Instant::now();
            let bytes = Bytes::from_static(b"not a table file");
            for i in 0..size {
                let path = Path::from(format!("other/o{i:07}"));
                wrapped
                    .put(&path, PutPayload::from_bytes(bytes.clone()))
                    .await?;
            }
            let writes = ms(began.elapsed());
            let after = median(&counted, 3, || timed(&ctx, SCAN)).await?;
            println!(
                "RESULT rewrites {size} cached: {size} writes through the wrapper {writes:.0} ms \
                 ({:.1} us each); warm scan of 2,000 files {:.1} ms before, {:.1} ms after",
                writes * 1000.0 / size as f64,
                before.0,
                after.0
            );
        }
        "entries" => {
            // What the handle cache holds per object: `size` objects (e_tags that are
            // content digests, as S3's) listed, then each read through the wrapper (metadata
            // recorded, access proven), at the defaults with a capacity above `size`; then
            // each read through a second store instance (another identity), whose bytes are
            // the first's: what one more identity costs per object.
            let store = ContentETags::new(Arc::try_unwrap(lake(size).await).expect("one owner"));
            store.learn(None).await?;
            let store = Arc::new(store);
            let Some(lake_cache) = LakeCache::builder()
                .with_env()
                .set("lakecache.handle.capacity", &(2 * size).to_string())
                .build()
                .ok()
                .filter(|_| cached)
            else {
                println!("RESULT entries {size} vanilla: not applicable");
                return Ok(());
            };
            let url = Url::parse(URL).expect("static");
            let wrapped = Arc::new(CachingObjectStore::new_arc(
                Arc::clone(&store),
                &url,
                &lake_cache,
            ));
            let base = peak_rss_mib();
            let listed = wrapped.list(Some(&Path::from("lake"))).count().await;
            let after_listing = peak_rss_mib();
            let read_all = |wrapped: Arc<dyn ObjectStore>| async move {
                for i in 0..size {
                    wrapped.get_range(&file_path(i), 0..4).await?;
                }
                Ok::<_, object_store::Error>(())
            };
            read_all(wrapped).await?;
            let after_reads = peak_rss_mib();
            // A store instance of its own: another identity.
            let own = Arc::new(PrefixStore::new(store, Path::default()));
            read_all(Arc::new(CachingObjectStore::new_arc(
                own,
                &url,
                &lake_cache,
            )))
            .await?;
            let after_other = peak_rss_mib();
            let bytes = |mib: f64| mib * 1024.0 * 1024.0 / size as f64;
            let h = lake_cache.stats().handle;
            println!(
                "RESULT entries {size} cached: a listing of {listed} objects {:.0} bytes each \
                 ({} bytes weighed); metadata and proofs {:.0} bytes per object, range entries \
                 of 4 bytes each included; a second identity {:.0} bytes per object ({} and {} \
                 entries)",
                bytes(after_listing - base),
                h.listing_bytes,
                bytes(after_reads - after_listing),
                bytes(after_other - after_reads),
                h.metadata.entries,
                h.proofs.entries,
            );
        }
        "memory" => {
            // Peak memory of a scan against vanilla's: `size` files of about 64 KiB, the
            // table registered, then the scan cold and 3 times warm. What the range cache
            // holds is counted apart: it is memory a user gave it.
            let bytes = sized_file();
            let file_bytes = bytes.len();
            // Over a 10 Gbit/s link, whose bodies arrive in buffers of their own (as a
            // network's do), not as slices of the in-memory store's one buffer.
            let latency = Duration::from_millis(common::arg("--latency-ms", 2));
            let linked = LatencyStore::s3_like(lake_of(size, bytes).await, latency, 7)
                .with_bandwidth(1_250_000_000);
            let counted = Arc::new(CountingStore::new(Arc::new(linked) as Arc<dyn ObjectStore>));
            let base = peak_rss_mib();
            let heap_base = heap_live_mib();
            let ctx = session(lake_cache.as_ref(), counted.clone())?;
            ctx.sql(TABLE).await?;
            timed(&ctx, SCAN).await?;
            let warm = median(&counted, 3, || timed(&ctx, SCAN)).await?;
            let peak = peak_rss_mib() - base;
            let held = lake_cache
                .as_ref()
                .map_or(0, |l| l.stats().range.memory_bytes) as f64
                / (1024.0 * 1024.0);
            println!(
                "RESULT memory {size} {mode}: {size} files of {file_bytes} bytes ({:.0} MiB); \
                 warm scan {:.1} ms ({}); peak rss +{peak:.0} MiB, of which the range cache \
                 holds {held:.0} MiB; +{:.0} MiB besides it; heap live at the end +{:.0} MiB",
                (size as usize * file_bytes) as f64 / (1024.0 * 1024.0),
                warm.0,
                shown(&warm.1),
                peak - held,
                heap_live_mib() - heap_base,
            );
        }
        other => panic!("no scenario {other}"),
    }
    Ok(())
}

/// Runs one scenario in a child process; returns its `RESULT` lines.
fn spawn(scenario: &str, mode: &str, size: u64) -> String {
    let me = std::env::current_exe().expect("this binary");
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    args.extend(
        ["--child", scenario, mode, &size.to_string()]
            .iter()
            .map(|s| s.to_string()),
    );
    let out = Command::new(me).args(&args).output().expect("child ran");
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return format!(
            "{scenario} {size} {mode}: failed: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or_default()
        );
    }
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("RESULT "))
        .collect::<Vec<_>>()
        .join("\n")
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--child") {
        let (scenario, mode) = (&args[at + 1], &args[at + 2]);
        let size: u64 = args[at + 3].parse().expect("a size");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        return runtime.block_on(child(scenario, mode, size));
    }
    let only = text("--scenario");
    println!("allocator: {}", common::ALLOCATOR);
    let scenarios: [(&str, Vec<u64>); 6] = [
        ("memory", list("--memory-files", &[2_000])),
        ("entries", list("--entries", &[1_000_000])),
        ("files", list("--files", &[10_000, 100_000])),
        ("identities", list("--identities", &[10, 100, 1_000])),
        ("concurrent", list("--queries", &[64])),
        ("rewrites", list("--rewrites", &[100_000])),
    ];
    for (scenario, sizes) in scenarios {
        if only.as_deref().is_some_and(|o| o != scenario) {
            continue;
        }
        let modes = text("--modes").unwrap_or_else(|| "vanilla,cached".to_string());
        for size in sizes {
            for mode in modes.split(',') {
                println!("{}", spawn(scenario, mode, size));
            }
        }
    }
    Ok(())
}
