//! Every byte a scan reads comes from the version its footer came from: objects replaced
//! while a query runs, between queries, under another store's same path, racing a listing,
//! and on stores that report versions on reads but not in listings. On the in-memory store
//! and, when configured, the S3 server.
//!
//! Replacements use files of one size and layout whatever their values
//! (`testkit::lake::same_layout_file`): only a version check tells the versions apart, and
//! a reader that took one version's footer and another's bytes would prune pages by the wrong
//! statistics and return rows of neither.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Backend, installed, remote_backends, rows, scan, sorted_lines};
use datafusion::execution::SessionStateBuilder;
use datafusion::physical_plan::collect;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::testkit::lake::{LakeSpec, file_bytes, same_layout_file};
use datafusion_lakecache::testkit::{CloudMetadata, CountingStore, LatencyStore};
use futures::StreamExt;
use object_store::path::Path;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

/// Files of the lake, and rows in each: 1.6 MB, so the 512 KiB DataFusion reads for a footer
/// leave most of the data to be read; two row groups of 100 pages per column.
const FILES: usize = 4;
const ROWS: usize = 100_000;

/// Queries that read different parts of the files: one row group, everything, pages chosen
/// by value statistics, and rows chosen by value.
const QUERIES: [&str; 4] = [
    "SELECT count(*), sum(value) FROM t WHERE id < 20000",
    "SELECT count(*), sum(value + id), min(value) FROM t",
    "SELECT count(*) FROM t WHERE value BETWEEN 20000000 AND 20100000",
    "SELECT min(id), max(id), count(*) FROM t WHERE value > 33000000",
];

fn config() -> SessionConfig {
    SessionConfig::new().with_target_partitions(2)
}

fn file(b: &Backend, i: usize) -> Path {
    b.prefix.clone().join(LakeSpec::file_name(i))
}

/// Writes file `i` of the lake at `seed`, directly in the store (behind the caches' back).
async fn write_file(b: &Backend, i: usize, seed: u64) {
    let bytes = same_layout_file(ROWS, seed).unwrap();
    b.raw
        .put(&file(b, i), PutPayload::from(bytes))
        .await
        .unwrap();
}

/// Every query's answer from DataFusion alone, over the store as it is now.
async fn answers(b: &Backend) -> Vec<Vec<String>> {
    let mut all = Vec::new();
    for sql in QUERIES {
        all.push(scan(b, Arc::clone(&b.raw), sql).await.unwrap());
    }
    all
}

/// Checks that `got`, the result of query `q`, is that query's answer in one of the states
/// the lake has been in, or an error naming the replaced file.
fn check(
    b: &Backend,
    q: usize,
    got: datafusion::error::Result<Vec<String>>,
    states: &[Vec<Vec<String>>],
) {
    let sql = QUERIES[q];
    match got {
        Ok(rows) => assert!(
            states.iter().any(|s| s[q] == rows),
            "{}: `{sql}` answered {rows:?}, which no state of the lake gives: {:?}",
            b.name,
            states.iter().map(|s| &s[q]).collect::<Vec<_>>()
        ),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains(&LakeSpec::file_name(0)) && msg.contains("changed"),
                "{}: `{sql}` failed without naming the changed file: {msg}",
                b.name
            );
        }
    }
}

async fn lake_on(b: &Backend) -> (LakeCache, SessionContext, Arc<common::Counted>) {
    for i in 0..FILES {
        // Even seeds are ascending, odd descending: versions' pages hold other values.
        write_file(b, i, 2 * i as u64).await;
    }
    let lake = LakeCache::builder().build().unwrap();
    let counted = b.counting();
    let store: Arc<dyn ObjectStore> = counted.clone();
    let ctx = installed(b, store, &lake, SessionStateBuilder::new(), config()).await;
    (lake, ctx, counted)
}

/// Plans query `q`, replaces file 0 (written at `seed`) before the plan runs, adds the new
/// state of the lake to `states`, and [`check`]s what the plan returns.
async fn replace_while_planned(
    b: &Backend,
    ctx: &SessionContext,
    q: usize,
    seed: u64,
    states: &mut Vec<Vec<Vec<String>>>,
) {
    let plan = ctx
        .sql(QUERIES[q])
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    write_file(b, 0, seed).await;
    states.push(answers(b).await);
    let got = collect(plan, ctx.task_ctx()).await;
    check(b, q, got.and_then(|batches| sorted_lines(&batches)), states);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_replaced_between_planning_and_reading_is_never_read_half_and_half() {
    for b in remote_backends("versions_plan") {
        let (_lake, ctx, _) = lake_on(&b).await;
        let mut states = vec![answers(&b).await];
        for q in 0..QUERIES.len() {
            replace_while_planned(&b, &ctx, q, 1 + 2 * q as u64, &mut states).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_replaced_between_two_queries_is_an_error_or_one_version_then_the_new_one() {
    for b in remote_backends("versions_between") {
        let (lake, ctx, counted) = lake_on(&b).await;
        counted.reset();
        let mut states = vec![answers(&b).await];
        // The first row group of every file is read, and kept.
        check(&b, 0, rows(&ctx, QUERIES[0]).await, &states);
        write_file(&b, 0, 1).await;
        states.push(answers(&b).await);
        // Within the listing's TTL: the plan names the old version, some of its bytes are held.
        counted.reset();
        check(&b, 1, rows(&ctx, QUERIES[1]).await, &states);
        assert!(
            counted.counts().get > 0,
            "{}: some bytes were not held",
            b.name
        );
        // The next query sees the new version.
        let new = states.last().unwrap().clone();
        for (q, sql) in QUERIES.iter().enumerate() {
            let got = rows(&ctx, sql).await.unwrap();
            assert_eq!(got, new[q], "{}: after the change was seen: {sql}", b.name);
        }
        let s = lake.stats();
        assert!(s.handle.version_changes > 0, "{}: {:?}", b.name, s.handle);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_holding_the_same_path_each_answer_from_their_own() {
    for b in remote_backends("versions_two_stores") {
        // Two stores under two URLs, each holding `lake/part-00000.parquet`: one size, other
        // values, written within the second the S3-like times are cut to.
        let under = |name: &str| -> Arc<dyn ObjectStore> {
            let store = PrefixStore::new(Arc::clone(&b.raw), b.prefix.clone().join(name));
            Arc::new(CloudMetadata::s3(store))
        };
        let stores = [under("one"), under("two")];
        let path = Path::from("lake/part-00000.parquet");
        for (seed, store) in stores.iter().enumerate() {
            let bytes = same_layout_file(ROWS, seed as u64 + 10).unwrap();
            store.put(&path, PutPayload::from(bytes)).await.unwrap();
        }
        let urls = [
            url::Url::parse("s3://one").unwrap(),
            url::Url::parse("s3://two").unwrap(),
        ];
        let lake = LakeCache::builder().build().unwrap();
        let mut sessions = Vec::new();
        let mut want = Vec::new();
        for (store, url) in stores.iter().zip(&urls) {
            let alone = SessionContext::new_with_config(config());
            alone.register_object_store(url, Arc::clone(store));
            let table = format!("{}/lake/", url.as_str().trim_end_matches('/'));
            alone
                .register_parquet("t", &table, Default::default())
                .await
                .unwrap();
            let mut per_query = Vec::new();
            for sql in QUERIES {
                per_query.push(rows(&alone, sql).await.unwrap());
            }
            want.push(per_query);
            let state = lake.install(
                SessionStateBuilder::new()
                    .with_default_features()
                    .with_config(config()),
            );
            let ctx = SessionContext::new_with_state(state.unwrap().build());
            ctx.register_object_store(url, Arc::clone(store));
            ctx.register_parquet("t", &table, Default::default())
                .await
                .unwrap();
            sessions.push(ctx);
        }
        assert_ne!(want[0], want[1], "{}: the stores hold other rows", b.name);
        for round in 0..2 {
            for (q, sql) in QUERIES.iter().enumerate() {
                for (s, ctx) in sessions.iter().enumerate() {
                    let got = rows(ctx, sql).await.unwrap();
                    assert_eq!(
                        got, want[s][q],
                        "{}: store {s}, round {round}: {sql}",
                        b.name
                    );
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_that_raced_a_write_through_the_wrapper_leaves_the_new_version_seen() {
    for b in remote_backends("versions_listing") {
        let spec = LakeSpec::small_files(2);
        b.write(&spec).await;
        let lake = LakeCache::builder().build().unwrap();
        let ctx = installed(
            &b,
            Arc::clone(&b.raw),
            &lake,
            SessionStateBuilder::new(),
            config(),
        )
        .await;
        let sql = "SELECT count(*), sum(id), max(name) FROM t";
        // Every byte of both files is held now.
        assert_eq!(
            rows(&ctx, sql).await.unwrap(),
            scan(&b, Arc::clone(&b.raw), sql).await.unwrap()
        );
        let url = datafusion::execution::object_store::ObjectStoreUrl::parse(&b.store_url).unwrap();
        let store = ctx.runtime_env().object_store(&url).unwrap();
        // A listing's page is fetched before a write through the session's store, and its
        // second object consumed after it.
        let mut listing = store.list(Some(&b.prefix));
        let first = listing.next().await.unwrap().unwrap();
        let other = file_bytes(&spec.with_seed(5), 1).unwrap();
        store
            .put(&file(&b, 1), PutPayload::from(other))
            .await
            .unwrap();
        let rest: Vec<_> = listing.collect().await;
        assert_eq!(rest.len() + 1, 2, "{}: {first:?}", b.name);
        let want = scan(&b, Arc::clone(&b.raw), sql).await.unwrap();
        assert_eq!(
            rows(&ctx, sql).await.unwrap(),
            want,
            "{}: the new version",
            b.name
        );
        let got = store.get_range(&file(&b, 1), 0..4).await.unwrap();
        assert_eq!(&got[..], b"PAR1", "{}", b.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_on_reads_but_not_in_listings_are_one_version() {
    for b in remote_backends("versions_gcs") {
        b.write(&LakeSpec::small_files(6)).await;
        let gcs: Arc<dyn ObjectStore> = Arc::new(CloudMetadata::gcs(Arc::clone(&b.raw)));
        let counted = Arc::new(CountingStore::new(gcs));
        let lake = LakeCache::builder().build().unwrap();
        let ctx = installed(
            &b,
            counted.clone(),
            &lake,
            SessionStateBuilder::new(),
            config(),
        )
        .await;
        let sql = "SELECT category, count(*), round(sum(value), 3) FROM t GROUP BY category";
        let want = scan(&b, Arc::clone(&b.raw), sql).await.unwrap();
        assert_eq!(rows(&ctx, sql).await.unwrap(), want);
        counted.reset();
        assert_eq!(rows(&ctx, sql).await.unwrap(), want);
        let c = counted.counts();
        assert_eq!((c.list, c.get, c.head), (0, 0, 0), "{}: {c:?}", b.name);
        assert_eq!(lake.stats().handle.version_changes, 0, "{}", b.name);
    }
}

/// With hedged GETs on a store with slow tails, a hedge is the same guarded request as the
/// one it races: an object replaced between planning and reading is still never read half
/// and half, whichever answer wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hedged_reads_of_a_replaced_object_are_never_half_and_half() {
    for b in remote_backends("versions_hedged") {
        for i in 0..FILES {
            write_file(&b, i, 2 * i as u64).await;
        }
        // Without the range cache every query reads its bytes again: many GETs to hedge.
        let lake = LakeCache::builder()
            .set("lakecache.store.hedge", "true")
            .range_cache(false)
            .build()
            .unwrap();
        // One request in 25 takes 50 times 2 ms: far past the 95th percentile, so hedged.
        let slow = LatencyStore::new(b.counting(), Duration::from_millis(2)).with_tail(25, 50, 3);
        let store: Arc<dyn ObjectStore> = Arc::new(slow);
        let ctx = installed(&b, store, &lake, SessionStateBuilder::new(), config()).await;
        let mut states = vec![answers(&b).await];
        for round in 0..3 {
            for q in 0..QUERIES.len() {
                let seed = 1 + 2 * (round * QUERIES.len() + q) as u64;
                replace_while_planned(&b, &ctx, q, seed, &mut states).await;
            }
        }
        let s = lake.stats().store;
        eprintln!("{}: {s:?}", b.name);
        assert!(s.hedged > 0, "{}: hedges were sent: {s:?}", b.name);
        assert!(
            s.hedged * 20 <= s.gets,
            "{}: at most 1 in 20: {s:?}",
            b.name
        );
    }
}
