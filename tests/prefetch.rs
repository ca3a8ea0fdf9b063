//! Prefetching through an installed session: one request per cold small file, many in flight,
//! the chunks DataFusion reads and no others, the memory pool respected, failures read again,
//! and nothing fetched once a query's stream is gone.
//!
//! The range cache is off here: with it, repeated queries of a remote lake make no requests
//! at all (tests/range.rs), which would hide what prefetching does. Local lakes are read with
//! `prefetch_local_files(true)`: off by default, local files are left to the page cache.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Backend, WORKLOAD, backends, installed, local_backend, rows, scan};
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::testkit::lake::LakeSpec;
use datafusion_lakecache::testkit::{CountingStore, FaultStore, LatencyStore, Op};
use futures::StreamExt;
use object_store::ObjectStore;

fn config() -> SessionConfig {
    SessionConfig::new().with_target_partitions(2)
}

/// A session installed from `lake` (with `builder`'s runtime, if any) where `t` is the lake.
async fn session(
    b: &Backend,
    store: Arc<dyn ObjectStore>,
    lake: &LakeCache,
    builder: SessionStateBuilder,
) -> SessionContext {
    installed(b, store, lake, builder, config()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_file_costs_one_request_and_many_run_at_once() {
    for b in backends("prefetch_small") {
        let files = 24;
        b.write(&LakeSpec::small_files(files)).await;
        // Footers not loaded when the table is listed, so that a scan meets files whose
        // footer it does not know.
        let lake = LakeCache::builder()
            .prefetch_local_files(true)
            .range_cache(false)
            .index_on_listing(false)
            .build()
            .unwrap();
        let counted = b.counting();
        let ctx = session(&b, counted.clone(), &lake, SessionStateBuilder::new()).await;
        for sql in WORKLOAD {
            counted.reset();
            let before = lake.stats().prefetch;
            let hedged_before = lake.stats().store.hedged;
            let want = scan(&b, b.raw.clone(), sql).await.unwrap();
            assert_eq!(rows(&ctx, sql).await.unwrap(), want, "{}: {sql}", b.name);
            let p = lake.stats().prefetch;
            // Hedged copies (at most one request in twenty) are not the scan's own.
            let hedged = lake.stats().store.hedged - hedged_before;
            let gets = counted.counts().get - hedged;
            eprintln!("{}: `{sql}`: {gets} GETs, {p:?}", b.name);
            assert_eq!(gets, files as u64, "{}: one GET per file: {sql}", b.name);
            assert_eq!(p.requests - before.requests, files as u64, "{}", b.name);
            assert!(p.bytes_used > before.bytes_used, "{}: {p:?}", b.name);
        }
        // Without its footer cached, a small file is fetched whole: one request serves
        // footer and data, where the reader alone would make two.
        lake.clear();
        counted.reset();
        let scans = lake.stats().prefetch.scans;
        let loads = lake.stats().index.footer_loads;
        let hedged_before = lake.stats().store.hedged;
        let sql = WORKLOAD[2];
        assert_eq!(
            rows(&ctx, sql).await.unwrap(),
            scan(&b, b.raw.clone(), sql).await.unwrap()
        );
        let hedged = lake.stats().store.hedged - hedged_before;
        assert_eq!(
            counted.counts().get - hedged,
            files as u64,
            "{}: whole files",
            b.name
        );
        assert_eq!(
            lake.stats().index.footer_loads - loads,
            files as u64,
            "{}: footers decoded from the prefetched bytes",
            b.name
        );
        let p = lake.stats().prefetch;
        // One run of the scan: a stop timer of a moment with no reader does not end it while
        // readers keep coming (a restart would fetch every file again).
        assert_eq!(p.scans - scans, 1, "{}: one run: {p:?}", b.name);
        assert!(
            p.peak_in_flight > 2,
            "{}: more downloads in flight than DataFusion's one per partition: {p:?}",
            b.name
        );
        assert_eq!(p.failed, 0, "{}: {p:?}", b.name);
        assert_eq!(p.reserved_bytes, 0, "{}: all released: {p:?}", b.name);
    }
}

/// A `LakeCache` for which every file of the test lakes counts as large (its footer and its
/// chunks are fetched apart), with chunks split into 64 KiB requests; no range cache.
fn large_file_lake() -> LakeCache {
    LakeCache::builder()
        .prefetch_local_files(true)
        .range_cache(false)
        .set("lakecache.prefetch.small_file", "1KiB")
        .set("lakecache.prefetch.split_size", "64KiB")
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_files_prefetch_exactly_the_chunks_datafusion_reads() {
    for b in backends("prefetch_large") {
        let spec = LakeSpec::small_files(4).with_row_groups_of(500);
        b.write(&spec).await;
        let lake = large_file_lake();
        let ctx = session(&b, b.raw.clone(), &lake, SessionStateBuilder::new()).await;
        let mut fetched = Vec::new();
        for sql in [
            "SELECT category, round(sum(value), 3) FROM t GROUP BY category",
            "SELECT id, value FROM t WHERE id < 700",
            "SELECT count(*), max(ts) FROM t WHERE id BETWEEN 4800 AND 5300",
        ] {
            let before = lake.stats().prefetch;
            let want = scan(&b, b.raw.clone(), sql).await.unwrap();
            assert_eq!(rows(&ctx, sql).await.unwrap(), want, "{}: {sql}", b.name);
            // The readers are gone; let the scan's grace period pass.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let p = lake.stats().prefetch;
            eprintln!("{}: `{sql}`: {p:?}", b.name);
            let (bytes, wasted) = (
                p.bytes_fetched - before.bytes_fetched,
                p.bytes_wasted - before.bytes_wasted,
            );
            assert!(p.bytes_used > before.bytes_used, "{}: {sql}", b.name);
            fetched.push((bytes, wasted));
        }
        assert_eq!(
            fetched[0].1, 0,
            "{}: a full scan reads every byte fetched",
            b.name
        );
        // The narrow range reads a few pages of two row groups: those are fetched, not the
        // row groups, and what is fetched and never read (bytes between pages fetched with
        // them) is at most 5%.
        let (bytes, wasted) = fetched[2];
        assert!(
            wasted * 20 <= bytes,
            "{}: the narrow range wastes {wasted} of {bytes} bytes",
            b.name
        );
        for (i, &(bytes, _)) in fetched.iter().enumerate().skip(1) {
            assert!(
                bytes * 3 < fetched[0].0,
                "{}: row groups pruned by statistics are not fetched: query {i}: {fetched:?}",
                b.name
            );
        }
        let p = lake.stats().prefetch;
        assert!(
            p.requests > 40,
            "{}: chunks split into requests: {p:?}",
            b.name
        );
        assert_eq!(p.reserved_bytes, 0, "{}: {p:?}", b.name);
    }
}

/// Counts requests above and below a delay of 40 ms per request: a request counted above but
/// never below was aborted during its round trip.
struct Tapped {
    above: Arc<CountingStore<Arc<dyn ObjectStore>>>,
    below: Arc<CountingStore<Arc<dyn ObjectStore>>>,
}

fn tapped(b: &Backend) -> Tapped {
    let below = Arc::new(CountingStore::new(Arc::clone(&b.raw)));
    // A link of 1 Gbit/s: what registration's footer reads measure of it sizes the first
    // scan's downloads (an unlimited link would ask for every file at once).
    let slow: Arc<dyn ObjectStore> = Arc::new(
        LatencyStore::new(
            Arc::clone(&below) as Arc<dyn ObjectStore>,
            Duration::from_millis(40),
        )
        .with_bandwidth(125_000_000),
    );
    Tapped {
        above: Arc::new(CountingStore::new(slow)),
        below,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_stream_aborts_its_downloads_and_starts_none() {
    let b = local_backend();
    // Enough files that a scan dropped after its first batch is far from done: a cold scan
    // starts the downloads the link registration measured needs in flight (1.5x its
    // bandwidth-delay product, 7.5 MB here: under 100 of these files), and grows them each
    // round trip.
    let files = 400;
    b.write(&LakeSpec::small_files(files)).await;
    let lake = LakeCache::builder()
        .prefetch_local_files(true)
        .range_cache(false)
        .build()
        .unwrap();
    let tap = tapped(&b);
    let ctx = session(&b, tap.above.clone(), &lake, SessionStateBuilder::new()).await;
    tap.above.reset();
    tap.below.reset();

    let mut stream = ctx
        .sql("SELECT * FROM t")
        .await
        .unwrap()
        .execute_stream()
        .await
        .unwrap();
    stream.next().await.unwrap().unwrap();
    drop(stream);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (above, below) = (tap.above.counts().get, tap.below.counts().get);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let p = lake.stats().prefetch;
    eprintln!("requested {above}, delivered {below}: {p:?}");
    assert_eq!(
        tap.above.counts().get,
        above,
        "no request starts after the drop"
    );
    assert_eq!(tap.below.counts().get, below, "none completes after 100 ms");
    assert!(above < files as u64 / 2, "the scan stopped early: {above}");
    assert!(p.cancelled > 0, "downloads in flight were aborted: {p:?}");
    assert!(
        below < above,
        "aborted downloads never reached the store: {p:?}"
    );
    assert_eq!(p.reserved_bytes, 0, "{p:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_reads_a_few_files() {
    let b = local_backend();
    b.write(&LakeSpec::small_files(120)).await;
    let lake = LakeCache::builder()
        .prefetch_local_files(true)
        .range_cache(false)
        .build()
        .unwrap();
    let tap = tapped(&b);
    let ctx = session(&b, tap.above.clone(), &lake, SessionStateBuilder::new()).await;
    tap.above.reset();
    let got = rows(&ctx, "SELECT id FROM t LIMIT 10").await.unwrap();
    assert_eq!(got.len(), 10 + 4, "10 rows and the table's frame");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let gets = tap.above.counts().get;
    eprintln!("LIMIT 10: {gets} GETs, {:?}", lake.stats().prefetch);
    assert!(gets <= 4, "a few files' worth: {gets} GETs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_stays_within_the_memory_pool_and_its_budget() {
    let b = local_backend();
    let spec = LakeSpec::small_files(40);
    b.write(&spec).await;
    let file = datafusion_lakecache::testkit::lake::file_bytes(&spec, 0)
        .unwrap()
        .len();
    let sql = WORKLOAD[0];
    let want = scan(&b, b.raw.clone(), sql).await.unwrap();

    // A pool with room for about three files: prefetch is refused, the query is not.
    let limit = 3 * file;
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_limit(limit, 1.0)
        .build_arc()
        .unwrap();
    let lake = LakeCache::builder()
        .prefetch_local_files(true)
        .range_cache(false)
        .build()
        .unwrap();
    let builder = SessionStateBuilder::new().with_runtime_env(runtime);
    let ctx = session(&b, b.raw.clone(), &lake, builder).await;
    assert_eq!(rows(&ctx, sql).await.unwrap(), want);
    let p = lake.stats().prefetch;
    eprintln!("pool of {limit} bytes: {p:?}");
    assert!(p.memory_denied > 0, "{p:?}");
    assert!(p.peak_reserved_bytes <= limit as u64 / 2, "{p:?}");

    // A budget of two files: never more reserved than the budget.
    let budget = 2 * file as u64;
    let lake = LakeCache::builder()
        .prefetch_local_files(true)
        .range_cache(false)
        .prefetch_buffer_bytes(budget / 4)
        .prefetch_max_bytes(budget)
        .build()
        .unwrap();
    let ctx = session(&b, b.raw.clone(), &lake, SessionStateBuilder::new()).await;
    assert_eq!(rows(&ctx, sql).await.unwrap(), want);
    let p = lake.stats().prefetch;
    eprintln!("budget of {budget} bytes: {p:?}");
    assert!(p.requests > 0 && p.peak_reserved_bytes <= budget, "{p:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_limit_set_by_sql_bounds_prefetching_to_half_of_it() {
    let b = local_backend();
    let spec = LakeSpec::small_files(40);
    b.write(&spec).await;
    let file = datafusion_lakecache::testkit::lake::file_bytes(&spec, 0)
        .unwrap()
        .len() as u64;
    let sql = WORKLOAD[0];
    let want = scan(&b, b.raw.clone(), sql).await.unwrap();
    let lake = LakeCache::builder()
        .prefetch_local_files(true)
        .range_cache(false)
        .build()
        .unwrap();
    let ctx = session(&b, b.raw.clone(), &lake, SessionStateBuilder::new()).await;

    // Unbounded at install: nothing refused.
    assert_eq!(rows(&ctx, sql).await.unwrap(), want);
    let p = lake.stats().prefetch;
    assert_eq!(p.memory_denied, 0, "{p:?}");
    assert!(
        p.peak_reserved_bytes > 4 * file,
        "several files at once: {p:?}"
    );

    // `SET` rebuilds the session's runtime; the next scans reserve in its pool.
    let limit_k = (8 * file).div_ceil(1024);
    ctx.sql(&format!(
        "SET datafusion.runtime.memory_limit = '{limit_k}K'"
    ))
    .await
    .unwrap()
    .collect()
    .await
    .unwrap();
    let before = lake.stats().prefetch;
    assert_eq!(rows(&ctx, sql).await.unwrap(), want);
    let p = lake.stats().prefetch;
    eprintln!("memory_limit {limit_k}K by SQL: {p:?}");
    assert!(p.memory_denied > before.memory_denied, "{p:?}");
    assert!(p.requests > before.requests, "still prefetching: {p:?}");
    // Peaks are per scan and the first scan's was higher: compare this scan's own figure.
    let lake2 = LakeCache::builder()
        .prefetch_local_files(true)
        .range_cache(false)
        .build()
        .unwrap();
    let ctx2 = session(&b, b.raw.clone(), &lake2, SessionStateBuilder::new()).await;
    ctx2.sql(&format!(
        "SET datafusion.runtime.memory_limit = '{limit_k}K'"
    ))
    .await
    .unwrap()
    .collect()
    .await
    .unwrap();
    assert_eq!(rows(&ctx2, sql).await.unwrap(), want);
    let p = lake2.stats().prefetch;
    assert!(p.memory_denied > 0, "{p:?}");
    assert!(
        p.peak_reserved_bytes <= limit_k * 1024 / 2,
        "at most half of the {limit_k}K pool: {p:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_prefetch_is_read_again_by_the_reader() {
    let b = local_backend();
    b.write(&LakeSpec::small_files(12)).await;
    let faults = Arc::new(FaultStore::new(Arc::clone(&b.raw)));
    // Chunks rather than whole files, with the footers cached by a first run: every request
    // of the second run is a prefetch, which its reader waits for and reads itself if it fails.
    let lake = LakeCache::builder()
        .prefetch_local_files(true)
        .range_cache(false)
        .set("lakecache.prefetch.small_file", "1KiB")
        .build()
        .unwrap();
    let ctx = session(&b, faults.clone(), &lake, SessionStateBuilder::new()).await;
    let sql = WORKLOAD[2];
    let want = scan(&b, b.raw.clone(), sql).await.unwrap();
    assert_eq!(rows(&ctx, sql).await.unwrap(), want);
    // One failure: the first GET of the run is a prefetch (readers wait for the downloads
    // in flight), so it fails and its reader reads again. With more, the reader's own read
    // could be the one that fails, and then the query fails as DataFusion's would.
    faults.fail(Op::Get, 1);
    assert_eq!(rows(&ctx, sql).await.unwrap(), want);
    let p = lake.stats().prefetch;
    assert!(p.failed >= 1, "{p:?}");
    // The failure was not kept: the same query again is served by prefetching alone.
    assert_eq!(rows(&ctx, sql).await.unwrap(), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_analyze_shows_the_scans_cache_and_prefetch_figures() {
    let b = local_backend();
    b.write(&LakeSpec::small_files(6)).await;
    let lake = LakeCache::builder()
        .prefetch_local_files(true)
        .range_cache(false)
        .build()
        .unwrap();
    let ctx = session(&b, b.raw.clone(), &lake, SessionStateBuilder::new()).await;
    let explain = |sql: &str| {
        let ctx = ctx.clone();
        let sql = format!("EXPLAIN ANALYZE {sql}");
        async move { rows(&ctx, &sql).await.unwrap().join("\n") }
    };
    // The footers were loaded when the table was listed; the first scan prefetches each
    // file's column chunks, the readers read nothing themselves.
    let text = explain(WORKLOAD[0]).await;
    for metric in [
        "prefetch_requests=6",
        "prefetch_bytes=",
        "prefetch_bytes_used=",
        "prefetch_peak_in_flight=",
        "prefetch_wait_time=",
        "index_footer_hits=6",
        "index_footer_misses=0",
        "bytes_from_store=0",
    ] {
        assert!(text.contains(metric), "{metric} in:\n{text}");
    }
    let again = explain(WORKLOAD[0]).await;
    for metric in ["index_footer_hits=6", "index_footer_misses=0"] {
        assert!(again.contains(metric), "{metric} in:\n{again}");
    }
    // A lookup on a bloom-filtered column: the first loads the filters (the prefetcher
    // ahead of the readers, which look each up once), the second finds them.
    let lookup = "SELECT id FROM t WHERE name = 'name-012345'";
    let cold = explain(lookup).await;
    let figure = |text: &str, name: &str| -> u64 {
        let at = text
            .find(&format!("{name}="))
            .unwrap_or_else(|| panic!("{name}: {text}"));
        let digits = text[at + name.len() + 1..]
            .chars()
            .take_while(char::is_ascii_digit);
        digits.collect::<String>().parse().unwrap()
    };
    let looked_up = figure(&cold, "index_bloom_hits") + figure(&cold, "index_bloom_misses");
    assert_eq!(looked_up, 6, "{cold}");
    let warm = explain(lookup).await;
    for metric in [
        "index_bloom_hits=6",
        "index_bloom_misses=0",
        "index_footer_misses=0",
    ] {
        assert!(warm.contains(metric), "{metric} in:\n{warm}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_above_a_filter_fetches_no_more_than_the_readers_read() {
    for b in backends("prefetch_limit_filter") {
        b.write(&LakeSpec::small_files(4).with_row_groups_of(500))
            .await;
        // A tenth of the rows match, so each reader meets the limit in its first row group;
        // the scan below the filter cannot know that. Each side runs it once first, so the
        // second run's figures are the data reads alone (footers are cached on both sides).
        let sql = "SELECT id, name FROM t WHERE name LIKE '%-00%' LIMIT 5";
        let plain = b.counting();
        // One partition: with two, whether the second reader asks for its first row group
        // before the first one's rows end the query is a race, on either side.
        let one = || SessionConfig::new().with_target_partitions(1);
        let vanilla = datafusion_lakecache::testkit::context(None, one()).unwrap();
        vanilla.register_object_store(&b.store_url, plain.clone());
        vanilla
            .register_parquet("t", b.table_url(), Default::default())
            .await
            .unwrap();
        rows(&vanilla, sql).await.unwrap();
        plain.reset();
        assert_eq!(rows(&vanilla, sql).await.unwrap().len(), 5 + 4);
        let lake = large_file_lake();
        let counted = b.counting();
        let ctx = installed(
            &b,
            counted.clone(),
            &lake,
            SessionStateBuilder::new(),
            one(),
        )
        .await;
        rows(&ctx, sql).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        counted.reset();
        let before = lake.stats().prefetch;
        assert_eq!(rows(&ctx, sql).await.unwrap().len(), 5 + 4);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (ours, theirs) = (counted.bytes(), plain.bytes());
        let p = lake.stats().prefetch;
        eprintln!("{}: {ours} bytes against vanilla's {theirs}: {p:?}", b.name);
        assert!(
            ours * 20 <= theirs * 21,
            "{}: {ours} bytes fetched, DataFusion alone reads {theirs}",
            b.name
        );
        assert!(
            p.bytes_used > before.bytes_used,
            "{}: the readers' reads were prefetched: {p:?}",
            b.name
        );
        // A filter no row passes: the readers read on past the first row group, and the
        // scan grows its downloads ahead of them as they show it.
        let sql = "SELECT id, name FROM t WHERE name LIKE '%zz%' LIMIT 5";
        let before = lake.stats().prefetch;
        assert_eq!(
            rows(&ctx, sql).await.unwrap(),
            rows(&vanilla, sql).await.unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        let p = lake.stats().prefetch;
        eprintln!("{}: no match: {p:?}", b.name);
        assert!(
            p.bytes_used - before.bytes_used > 4 * theirs,
            "{}: most of the name column came prefetched: {p:?}",
            b.name
        );
        assert!(
            p.peak_in_flight > 2,
            "{}: downloads ran ahead of the readers: {p:?}",
            b.name
        );
    }
}

/// On a link where more downloads always bring more throughput (a latency per request and no
/// bandwidth limit), a scan's downloads grow past any fixed count, as far as its pieces go;
/// `max_in_flight` is a ceiling they never pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downloads_grow_with_the_link_under_their_ceiling() {
    let b = local_backend();
    let files = 240;
    b.write(&LakeSpec::small_files(files)).await;
    let sql = "SELECT category, round(sum(value), 3) FROM t GROUP BY category ORDER BY category";
    let want = scan(&b, b.raw.clone(), sql).await.unwrap();
    for ceiling in [None, Some(48)] {
        let mut builder = LakeCache::builder()
            .prefetch_local_files(true)
            .range_cache(false);
        if let Some(ceiling) = ceiling {
            builder = builder.prefetch_max_in_flight(ceiling);
        }
        let lake = builder.build().unwrap();
        let tap = tapped(&b);
        let ctx = session(&b, tap.above.clone(), &lake, SessionStateBuilder::new()).await;
        // Cold (whole small files), then warm (footers cached, the chunks only).
        for _ in 0..2 {
            assert_eq!(rows(&ctx, sql).await.unwrap(), want, "{ceiling:?}");
        }
        let p = lake.stats().prefetch;
        eprintln!("ceiling {ceiling:?}: {p:?}");
        match ceiling {
            // 64 was the fixed cap before downloads followed the link.
            None => assert!(p.peak_in_flight > 64, "{p:?}"),
            Some(ceiling) => assert!(p.peak_in_flight <= ceiling as u64, "{p:?}"),
        }
        assert_eq!(p.failed, 0, "{p:?}");
    }
}
