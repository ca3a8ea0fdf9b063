//! The range cache through installed sessions: repeated scans of a remote lake stop making
//! requests, a replaced object is read anew, a warm disk tier serves a new process, and the
//! memory tier keeps to its bound.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{WORKLOAD, installed, remote_backends, rows, scan};
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::SessionConfig;
use datafusion_lakecache::stats::RANGE_ENTRY_BOOKKEEPING;
use datafusion_lakecache::testkit::corrupt_files_below;
use datafusion_lakecache::testkit::lake::{LakeSpec, file_bytes};
use datafusion_lakecache::{CachingObjectStore, LakeCache};
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

fn config() -> SessionConfig {
    SessionConfig::new().with_target_partitions(2)
}

/// A session installed from `lake` where `t` is `b`'s lake read through `store`.
async fn session(
    b: &common::Backend,
    store: Arc<dyn ObjectStore>,
    lake: &LakeCache,
) -> datafusion::prelude::SessionContext {
    installed(b, store, lake, SessionStateBuilder::new(), config()).await
}

/// A `LakeCache` whose disk tier is `dir`.
fn with_disk(dir: &std::path::Path) -> LakeCache {
    LakeCache::builder()
        .range_disk(dir, 64 << 20)
        .build()
        .unwrap()
}

/// Runs `sql` over `b`'s lake with a disk tier in `dir` and waits for its writes: what a
/// previous process leaves behind. Returns the rows.
async fn fill_disk_tier(b: &common::Backend, dir: &std::path::Path, sql: &str) -> Vec<String> {
    let want = scan(b, b.raw.clone(), sql).await.unwrap();
    let lake = with_disk(dir);
    let ctx = session(b, b.counting(), &lake).await;
    assert_eq!(rows(&ctx, sql).await.unwrap(), want);
    lake.flush().await;
    assert!(lake.stats().range.disk_writes > 0);
    want
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_scans_of_a_remote_lake_make_no_requests() {
    for b in remote_backends("range_repeat") {
        let files = 12;
        b.write(&LakeSpec::small_files(files)).await;
        let lake = LakeCache::builder().build().unwrap();
        let counted = b.counting();
        let ctx = session(&b, counted.clone(), &lake).await;
        let created = counted.counts();
        eprintln!("{}: CREATE: {created:?}", b.name);
        for run in 0..2 {
            for sql in WORKLOAD {
                counted.reset();
                let hedged = lake.stats().store.hedged;
                let want = scan(&b, b.raw.clone(), sql).await.unwrap();
                assert_eq!(rows(&ctx, sql).await.unwrap(), want, "{}: {sql}", b.name);
                let gets = counted.counts().get - (lake.stats().store.hedged - hedged);
                eprintln!("{}: run {run}: {gets} GETs: {sql}", b.name);
                // Registration read the footers; each query's first run reads the columns it
                // reads of each file once (one request per file), its second none.
                let most = if run == 0 { files as u64 } else { 0 };
                assert!(
                    gets <= most,
                    "{}: run {run}: {gets} GETs: {sql}: {:?}",
                    b.name,
                    lake.stats().range
                );
            }
        }
        let r = lake.stats().range;
        assert!(
            r.bytes_from_memory > 0 && r.memory_bytes > 0,
            "{}: {r:?}",
            b.name
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_object_is_read_anew_once_its_new_version_shows() {
    for b in remote_backends("range_replaced") {
        let paths = b.write(&LakeSpec::small_files(4)).await;
        let lake = LakeCache::builder()
            .handle_ttl(Duration::from_millis(500))
            .list_ttl(Duration::from_millis(500))
            .build()
            .unwrap();
        let counted = b.counting();
        let ctx = session(&b, counted.clone(), &lake).await;
        let sql = "SELECT count(*), round(sum(value), 3), max(name) FROM t";
        let before = rows(&ctx, sql).await.unwrap();
        assert_eq!(before, scan(&b, b.raw.clone(), sql).await.unwrap());

        // Another writer replaces a file with other rows.
        let other = file_bytes(&LakeSpec::small_files(4).with_seed(99), 0).unwrap();
        b.raw.put(&paths[0], PutPayload::from(other)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(700)).await;

        let want = scan(&b, b.raw.clone(), sql).await.unwrap();
        assert_ne!(want, before, "{}: the data changed", b.name);
        assert_eq!(
            rows(&ctx, sql).await.unwrap(),
            want,
            "{}: the new rows",
            b.name
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partly_cached_read_of_a_replaced_object_never_mixes_versions() {
    for b in remote_backends("range_mixed") {
        let path = b.prefix.clone().join("blob");
        let old: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
        let new: Vec<u8> = old.iter().map(|x| x ^ 0xff).collect();
        b.raw
            .put(&path, PutPayload::from(old.clone()))
            .await
            .unwrap();
        let lake = LakeCache::builder().build().unwrap();
        let counted = b.counting();
        let store = CachingObjectStore::new_arc(counted.clone(), &b.store_url, &lake);
        store.head(&path).await.unwrap();
        assert_eq!(store.get_range(&path, 0..1000).await.unwrap(), &old[..1000]);
        counted.reset();
        assert_eq!(store.get_range(&path, 0..1000).await.unwrap(), &old[..1000]);
        assert_eq!(counted.counts().get, 0, "{}: held", b.name);

        // Replaced behind the wrapper's back: a read reaching past the held bytes fetches the
        // rest guarded by the old version, and fails naming the file rather than join two
        // versions' bytes; the next read is of the new version, whole.
        b.raw
            .put(&path, PutPayload::from(new.clone()))
            .await
            .unwrap();
        let whole = 0..2000;
        let err = store
            .get_ranges(&path, std::slice::from_ref(&whole))
            .await
            .unwrap_err();
        assert!(
            datafusion_lakecache::VersionChanged::find(&err).is_some(),
            "{}: {err}",
            b.name
        );
        let got = store
            .get_ranges(&path, std::slice::from_ref(&whole))
            .await
            .unwrap();
        assert_eq!(got[0], &new[..2000], "{}: the new version only", b.name);
        let got = store.get_range(&path, 0..1000).await.unwrap();
        assert_eq!(got, &new[..1000], "{}: and from then on", b.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_process_with_a_warm_disk_tier_reads_no_data() {
    for b in remote_backends("range_disk") {
        let files = 8;
        b.write(&LakeSpec::small_files(files)).await;
        let dir = tempfile::tempdir().unwrap();
        let sql = WORKLOAD[2];
        let want = fill_disk_tier(&b, dir.path(), sql).await;
        // A new LakeCache on the same directory stands for a new process.
        let lake = with_disk(dir.path());
        let counted = b.counting();
        let ctx = session(&b, counted.clone(), &lake).await;
        assert_eq!(rows(&ctx, sql).await.unwrap(), want, "{}", b.name);
        let counts = counted.counts();
        assert_eq!(counts.get, 0, "{}: no data requests: {counts:?}", b.name);
        assert!(counts.list > 0, "{}: versions checked by listing", b.name);
        if b.name == "s3" {
            // s3s-fs lists objects without their e_tags: one HEAD each learns them.
            assert_eq!(counts.head, files as u64, "{}", b.name);
        }
        let r = lake.stats().range;
        assert!(r.bytes_from_disk > 0, "{}: {r:?}", b.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_on_the_disk_tier_are_fetched_ahead_of_the_readers() {
    for b in remote_backends("range_disk_ahead") {
        b.write(&LakeSpec::small_files(8)).await;
        let dir = tempfile::tempdir().unwrap();
        let sql = WORKLOAD[2];
        let want = fill_disk_tier(&b, dir.path(), sql).await;
        // A new process: its memory is empty, its disk tier holds every byte the scan reads.
        let lake = with_disk(dir.path());
        let counted = b.counting();
        let ctx = session(&b, counted.clone(), &lake).await;
        let before = lake.stats().prefetch.requests;
        assert_eq!(rows(&ctx, sql).await.unwrap(), want, "{}", b.name);
        assert_eq!(
            counted.counts().get,
            0,
            "{}: nothing from the store",
            b.name
        );
        // Reading from disk waits for a blocking thread and the disk: the prefetcher reads
        // those bytes ahead of the readers, as it would download them.
        let p = lake.stats().prefetch;
        assert!(p.requests > before, "{}: {p:?}", b.name);
        assert!(p.bytes_used > 0, "{}: the readers took them: {p:?}", b.name);
        assert!(lake.stats().range.bytes_from_disk > 0, "{}", b.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_tier_keeps_to_its_bound_under_a_larger_lake() {
    for b in remote_backends("range_bound") {
        // 60 files of about 50 KB (each small enough to be kept whole): 3 MB against 1 MiB.
        let spec = LakeSpec {
            files: 60,
            rows_per_file: 1_000,
            row_group_rows: 1_000,
            seed: 42,
        };
        b.write(&spec).await;
        let lake = LakeCache::builder()
            .range_memory_bytes(1 << 20)
            .build()
            .unwrap();
        let ctx = session(&b, b.counting(), &lake).await;
        for sql in WORKLOAD {
            let want = scan(&b, b.raw.clone(), sql).await.unwrap();
            assert_eq!(rows(&ctx, sql).await.unwrap(), want, "{}: {sql}", b.name);
            let r = lake.stats().range;
            assert!(r.memory_bytes <= 1 << 20, "{}: {r:?}", b.name);
        }
        let r = lake.stats().range;
        assert!(
            r.memory_bytes > 0 && r.bytes_from_store > 2 << 20,
            "{}: {r:?}",
            b.name
        );
        // The bound was reached, not merely never approached.
        assert!(r.memory.evictions > 0, "{}: {r:?}", b.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_analyze_shows_where_the_bytes_came_from() {
    let b = common::memory_backend();
    b.write(&LakeSpec::small_files(6).with_row_groups_of(2_000))
        .await;
    let lake = LakeCache::builder().prefetch(false).build().unwrap();
    let ctx = session(&b, b.counting(), &lake).await;
    let explain = |sql: &str| {
        let ctx = ctx.clone();
        let sql = format!("EXPLAIN ANALYZE {sql}");
        async move { rows(&ctx, &sql).await.unwrap().join("\n") }
    };
    // Registration read the footers; the first scan reads the data from the store, the
    // next one every byte from memory.
    let first = explain(WORKLOAD[2]).await;
    assert!(!first.contains("bytes_from_store=0"), "{first}");
    let text = explain(WORKLOAD[2]).await;
    for metric in ["bytes_from_store=0", "bytes_from_disk=0"] {
        assert!(text.contains(metric), "{metric} in:\n{text}");
    }
    assert!(!text.contains("bytes_from_memory=0"), "{text}");
    // After clearing, the scan fetches from the store (all but the end of each file, which
    // the listing's footer reads brought), and the next one reads memory again.
    lake.clear();
    let cold = explain(WORKLOAD[2]).await;
    assert!(!cold.contains("bytes_from_store=0"), "{cold}");
    let warm = explain(WORKLOAD[2]).await;
    assert!(warm.contains("bytes_from_store=0"), "{warm}");
    // Every read found its object's version in the handle cache (listed when planning).
    assert!(warm.contains("handle_misses=0"), "{warm}");
    assert!(!warm.contains("handle_hits=0"), "{warm}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_disk_entries_are_refetched_and_the_rows_stay_right() {
    let b = common::memory_backend();
    b.write(&LakeSpec::small_files(4)).await;
    let dir = tempfile::tempdir().unwrap();
    let sql = WORKLOAD[0];
    let want = fill_disk_tier(&b, dir.path(), sql).await;
    // Flip a byte in the middle of every entry: disk rot, or another program's writes.
    let entries = corrupt_files_below(dir.path(), |len| len / 2).unwrap();
    assert!(entries >= 4);
    let lake = with_disk(dir.path());
    let counted = b.counting();
    let ctx = session(&b, counted.clone(), &lake).await;
    assert_eq!(
        rows(&ctx, sql).await.unwrap(),
        want,
        "the store's bytes, not the disk's"
    );
    let r = lake.stats().range;
    assert!(r.disk_corrupt >= 4, "{r:?}");
    assert_eq!(r.bytes_from_disk, 0, "{r:?}");
    assert!(counted.counts().get >= 4, "refetched");
}

/// `n` new sessions of one new `LakeCache` registering `b`'s lake and running `sql` at once
/// over a store 20 ms away; checks their rows, returns the requests that reached the store.
async fn sessions_at_once(
    b: &common::Backend,
    n: usize,
    sql: &str,
    want: &[String],
) -> (
    datafusion_lakecache::testkit::RequestCounts,
    LakeCache,
    Vec<String>,
) {
    let lake = LakeCache::builder().build().unwrap();
    let counted = b.counting();
    let remote = counted.clone() as Arc<dyn ObjectStore>;
    let slow: Arc<dyn ObjectStore> = Arc::new(datafusion_lakecache::testkit::LatencyStore::new(
        remote,
        Duration::from_millis(20),
    ));
    let contexts =
        futures::future::join_all((0..n).map(|_| session(b, Arc::clone(&slow), &lake))).await;
    let results = futures::future::join_all(contexts.iter().map(|ctx| rows(ctx, sql))).await;
    for got in results {
        assert_eq!(got.unwrap(), want, "{}: {sql}", b.name);
    }
    // Hedged copies (at most one request in twenty) are counted apart.
    let mut counts = counted.counts();
    counts.get -= lake.stats().store.hedged;
    (counts, lake, requested(&counted))
}

/// The GETs `counted` saw, by file and range, sorted: what a failure names.
fn requested(counted: &common::Counted) -> Vec<String> {
    let mut gets: Vec<String> = counted
        .gets()
        .iter()
        .map(|(path, range)| format!("{} {range:?}", path.filename().unwrap_or_default()))
        .collect();
    gets.sort();
    gets
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_cold_sessions_share_every_download() {
    for b in remote_backends("range_shared") {
        b.write(&LakeSpec::small_files(12)).await;
        for sql in [WORKLOAD[0], WORKLOAD[1]] {
            let want = scan(&b, b.raw.clone(), sql).await.unwrap();
            let (alone, _, _) = sessions_at_once(&b, 1, sql, &want).await;
            let (four, lake, gets) = sessions_at_once(&b, 4, sql, &want).await;
            let r = lake.stats().range;
            eprintln!("{}: one session {alone:?}, four {four:?}, {r:?}", b.name);
            // Each file's footer (at registration) and data, read once for all four: what
            // one session reads.
            let once = 2 * 12;
            assert!(
                four.get <= once && alone.get <= once,
                "{}: {four:?} for four sessions, {alone:?} for one: {sql}; the four's GETs: \
                 {gets:#?}",
                b.name
            );
            // Each download was made once: joined while in flight or, where one session ran
            // ahead of the others (a loaded machine), served from the cache after it, so the
            // store sent no byte the cache does not hold once.
            let held = r.memory_bytes - r.memory.entries * RANGE_ENTRY_BOOKKEEPING;
            assert!(
                r.shared > 0 || r.bytes_from_store <= held,
                "{}: downloads were joined or reused: {r:?}",
                b.name
            );
        }
    }
}
