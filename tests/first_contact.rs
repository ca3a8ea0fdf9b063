//! A lake this process has never seen: registering a table costs one LIST and one round of
//! footer reads, all at once (DataFusion alone reads them 32 at a time, small files whole),
//! and DataFusion's planning finds them cached. On the in-memory store and the S3 server.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{memory_backend, remote_backends, rows, scan};
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::testkit::lake::{LakeSpec, write_lake};
use datafusion_lakecache::testkit::{ContentETags, CountingStore, LatencyStore};
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

const FILES: usize = 100;

fn session(lake: &LakeCache) -> SessionContext {
    let builder = SessionStateBuilder::new()
        .with_default_features()
        .with_config(SessionConfig::new().with_target_partitions(2));
    SessionContext::new_with_state(lake.install(builder).unwrap().build())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registering_a_table_either_way_lists_once_and_reads_every_footer_at_once() {
    // `CREATE EXTERNAL TABLE` (a `LakeTable`) and `register_parquet` (a plain
    // `ListingTable` in the installed session) alike.
    for b in remote_backends("first_contact_register") {
        b.write(&LakeSpec::small_files(FILES)).await;
        let sql = "SELECT category, count(*) FROM t GROUP BY category ORDER BY category";
        let want = scan(&b, Arc::clone(&b.raw), sql).await.unwrap();
        for by_sql in [true, false] {
            let lake = LakeCache::builder().build().unwrap();
            let name = format!(
                "{} ({})",
                b.name,
                match by_sql {
                    true => "CREATE EXTERNAL TABLE",
                    false => "register_parquet",
                }
            );
            // Slow enough that requests sent one round after another could not overlap.
            let slow = LatencyStore::new(Arc::clone(&b.raw), Duration::from_millis(50));
            let counted = Arc::new(CountingStore::new(slow));
            let ctx = session(&lake);
            ctx.register_object_store(&b.store_url, counted.clone() as Arc<dyn ObjectStore>);
            if by_sql {
                let create = format!(
                    "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION '{}'",
                    b.table_url()
                );
                ctx.sql(&create).await.unwrap();
            } else {
                ctx.register_parquet("t", b.table_url(), ParquetReadOptions::default())
                    .await
                    .unwrap();
            }
            let mut c = counted.counts();
            // Hedged copies (at most one request in twenty) are counted apart.
            let hedged = lake.stats().store.hedged;
            c.get -= hedged;
            let file_bytes = b
                .raw
                .head(&b.prefix.clone().join(LakeSpec::file_name(0)))
                .await;
            let file_bytes = file_bytes.unwrap().size;
            eprintln!(
                "{}: registered {c:?}, {} bytes, {} at once, {:?}",
                name,
                counted.bytes(),
                counted.peak_in_flight(),
                lake.stats().index
            );
            assert_eq!(c.list, 1, "{}: one listing: {c:?}", name);
            assert_eq!(
                c.get, FILES as u64,
                "{}: one footer read per file: {c:?}",
                name
            );
            assert_eq!(c.head, 0, "{}: {c:?}", name);
            // All at once, not DataFusion's 32 at a time.
            assert!(counted.peak_in_flight() >= FILES as u64, "{}", name);
            // The footers, not the files: small files are not read whole.
            assert!(
                counted.bytes() < FILES as u64 * file_bytes / 2,
                "{}: {} bytes for {FILES} files of {file_bytes}",
                name,
                counted.bytes()
            );
            let s = lake.stats().index;
            assert_eq!(
                (s.warmed, s.footer_loads),
                (FILES as u64, FILES as u64),
                "{}: {s:?}",
                name
            );
            // The first query finds every footer: it reads data only.
            counted.reset();
            assert_eq!(rows(&ctx, sql).await.unwrap(), want, "{}", name);
            let c = counted.counts();
            assert_eq!((c.list, c.head), (0, 0), "{}: {c:?}", name);
            assert_eq!(lake.stats().index.footer_loads, FILES as u64, "{}", name);
        }
    }
}

async fn create(ctx: &SessionContext, name: &str, url: &str) {
    let sql = format!("CREATE EXTERNAL TABLE {name} STORED AS PARQUET LOCATION '{url}'");
    ctx.sql(&sql).await.unwrap();
}

/// Two tables of [`FILES`] files in one in-memory store (`a` at the backend's table URL, `b`
/// at the URL returned), and a lake whose index cache has room for one table's footers and a
/// half, reading four footers at a time (the room is checked as each read starts, so up to
/// four may pass it).
async fn two_tables_and_room_for_one_and_a_half() -> (common::Backend, String, LakeCache) {
    let b = memory_backend();
    b.write(&LakeSpec::small_files(FILES)).await;
    let spec = LakeSpec::small_files(FILES).with_seed(2);
    write_lake(b.raw.as_ref(), &Path::from("other"), &spec)
        .await
        .unwrap();
    let other_url = format!("{}/other/", b.store_url.as_str().trim_end_matches('/'));
    // What one table's footers take.
    let sized = LakeCache::builder().build().unwrap();
    let ctx = session(&sized);
    ctx.register_object_store(&b.store_url, Arc::clone(&b.raw));
    create(&ctx, "a", &b.table_url()).await;
    let one_table = sized.stats().index.bytes;
    assert_eq!(sized.stats().index.warmed, FILES as u64);
    let lake = LakeCache::builder()
        .index_capacity_bytes(one_table * 8 / 5)
        .set("lakecache.prefetch.max_in_flight", "4")
        .build()
        .unwrap();
    (b, other_url, lake)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_loads_footers_into_the_room_the_index_cache_has_free_and_evicts_none() {
    let (b, other_url, lake) = two_tables_and_room_for_one_and_a_half().await;
    let ctx = session(&lake);
    ctx.register_object_store(&b.store_url, Arc::clone(&b.raw));
    create(&ctx, "a", &b.table_url()).await;
    let s = lake.stats().index;
    assert_eq!(
        s.warmed, FILES as u64,
        "the first table's footers all fit: {s:?}"
    );
    create(&ctx, "b", &other_url).await;
    let s = lake.stats().index;
    let second = s.warmed - FILES as u64;
    assert!(
        second > 0 && second < FILES as u64,
        "the second table's footers fill what is free: {s:?}"
    );
    assert_eq!(s.footers.evictions, 0, "{s:?}");
    // The first table's footers are all still held: its query loads none.
    let loads = s.footer_loads;
    let sql = "SELECT category, count(*) FROM a WHERE value > 0 GROUP BY category";
    assert!(!rows(&ctx, sql).await.unwrap().is_empty());
    assert_eq!(lake.stats().index.footer_loads, loads);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_ending_at_once_share_the_index_caches_free_room() {
    let (b, other_url, lake) = two_tables_and_room_for_one_and_a_half().await;
    let ctx = session(&lake);
    // Each footer read waits 5 ms, so the two warm-ups overlap (if they do not, the
    // assertions hold all the same).
    let slow = LatencyStore::new(Arc::clone(&b.raw), Duration::from_millis(5));
    ctx.register_object_store(&b.store_url, Arc::new(slow) as Arc<dyn ObjectStore>);
    let table_url = b.table_url();
    tokio::join!(create(&ctx, "a", &table_url), create(&ctx, "b", &other_url));
    let s = lake.stats().index;
    assert!(s.warmed < 2 * FILES as u64, "{s:?}");
    assert_eq!(s.footers.evictions, 0, "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_store_identity_proves_a_warm_lake_with_one_round_of_heads() {
    for b in remote_backends("first_contact_prove") {
        b.write(&LakeSpec::small_files(FILES)).await;
        let lake = LakeCache::builder().build().unwrap();
        let create = format!(
            "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION '{}'",
            b.table_url()
        );
        let owner = session(&lake);
        owner.register_object_store(&b.store_url, Arc::clone(&b.raw));
        owner.sql(&create).await.unwrap();
        // A store of its own over the same backend: it must prove every version it gets a
        // hit for, which it does for all files at once, in the listing's round.
        let slow = LatencyStore::new(Arc::clone(&b.raw), Duration::from_millis(50));
        let counted = Arc::new(CountingStore::new(slow));
        let other = session(&lake);
        other.register_object_store(&b.store_url, counted.clone() as Arc<dyn ObjectStore>);
        let hedged = lake.stats().store.hedged;
        other.sql(&create).await.unwrap();
        let c = counted.counts();
        // This store answers slower than the owner's, whose times it shares: some of its
        // HEADs may get copies, within the hedging budget.
        let copies = lake.stats().store.hedged - hedged;
        eprintln!(
            "{}: {c:?}, {} at once, {copies} copies",
            b.name,
            counted.peak_in_flight()
        );
        assert_eq!((c.list, c.get), (1, 0), "{}: {c:?}", b.name);
        assert_eq!(c.head, FILES as u64 + copies, "{}: {c:?}", b.name);
        let peak = counted.peak_in_flight();
        assert!(
            peak >= FILES as u64 && peak <= FILES as u64 + copies,
            "{}: {peak}",
            b.name
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_point_lookup_reads_bloom_filters_then_only_the_row_group_they_keep() {
    for b in remote_backends("first_contact_bloom") {
        // 20 files of 8 row groups; `name` is unique and spread over every row group's
        // statistics, so only bloom filters rule row groups out: one row matches.
        let files = 20;
        b.write(&LakeSpec::small_files(files).with_row_groups_of(625))
            .await;
        let sql = "SELECT id, name FROM t WHERE name = 'name-012345'";
        let create = format!(
            "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION '{}'",
            b.table_url()
        );
        // DataFusion alone, and through the caches: what the query reads after CREATE.
        let mut sides = Vec::new();
        for cached in [false, true] {
            let lake = LakeCache::builder().build().unwrap();
            let counted = Arc::new(CountingStore::new(Arc::clone(&b.raw)));
            let ctx = match cached {
                true => session(&lake),
                false => {
                    SessionContext::new_with_config(SessionConfig::new().with_target_partitions(2))
                }
            };
            ctx.register_object_store(&b.store_url, counted.clone() as Arc<dyn ObjectStore>);
            ctx.sql(&create).await.unwrap();
            counted.reset();
            let got = rows(&ctx, sql).await.unwrap();
            let gets = counted.gets();
            sides.push((got, counted.counts(), counted.bytes(), gets, lake.stats()));
        }
        let (vanilla, ours) = (&sides[0], &sides[1]);
        eprintln!(
            "{}: vanilla {:?} {} bytes; lakecache {:?} {} bytes; index {:?}",
            b.name, vanilla.1, vanilla.2, ours.1, ours.2, ours.4.index
        );
        assert_eq!(ours.0, vanilla.0, "{}: the one matching row", b.name);
        assert_eq!(ours.0.len(), 5, "{}: {:?}", b.name, ours.0);
        // The bloom filters were fetched ahead, then only what they keep: about the bytes
        // DataFusion alone reads, not every row group's data.
        assert!(
            ours.2 as f64 <= 1.2 * vanilla.2 as f64,
            "{}: {} bytes against vanilla's {}",
            b.name,
            ours.2,
            vanilla.2
        );
        // And no more requests: each filter read once (a reader's own read of a filter joins
        // its prefetch when it comes first), then the data of the one row group.
        assert!(
            ours.1.get <= vanilla.1.get,
            "{}: {:?} against {:?}",
            b.name,
            ours.1,
            vanilla.1
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_logs_listing_starts_no_footer_read_where_a_tables_listing_does() {
    let b = common::memory_backend();
    b.write(&LakeSpec::small_files(4)).await;
    // A Delta log holds Parquet files too (its checkpoints); they are read as the log says.
    let log = Path::from("delta/_delta_log");
    for i in 0..4 {
        let file = b.prefix.clone().join(LakeSpec::file_name(i));
        let bytes = b.raw.get(&file).await.unwrap().bytes().await.unwrap();
        let checkpoint = log.clone().join(format!("{i:020}.checkpoint.parquet"));
        b.raw.put(&checkpoint, bytes.into()).await.unwrap();
    }
    let lake = LakeCache::builder().build().unwrap();
    let counted = b.counting();
    let ctx = session(&lake);
    ctx.register_object_store(&b.store_url, counted.clone() as Arc<dyn ObjectStore>);
    let store = ctx
        .runtime_env()
        .object_store_registry
        .get_store(&b.store_url)
        .unwrap();
    let listed: Vec<_> = store.list(Some(&log)).try_collect().await.unwrap();
    assert_eq!(listed.len(), 4);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(counted.counts().get, 0, "{:?}", counted.counts());
    assert_eq!(lake.stats().index.warmed, 0);
    // The table's own listing starts its footer reads.
    let listed: Vec<_> = store.list(Some(&b.prefix)).try_collect().await.unwrap();
    assert_eq!(listed.len(), 4);
    let began = std::time::Instant::now();
    while lake.stats().index.warmed < 4 && began.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(lake.stats().index.warmed, 4, "{:?}", lake.stats().index);
    assert_eq!(counted.counts().get, 4, "{:?}", counted.counts());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hedging_is_on_by_default_and_a_slow_requests_copy_answers_for_it() {
    let b = common::memory_backend();
    b.write(&LakeSpec::small_files(FILES)).await;
    let sql = "SELECT category, count(*) FROM t GROUP BY category ORDER BY category";
    let want = scan(&b, Arc::clone(&b.raw), sql).await.unwrap();
    for hedge in [None, Some(false)] {
        let mut builder = LakeCache::builder();
        if let Some(on) = hedge {
            builder = builder.hedge_requests(on);
        }
        let lake = builder.build().unwrap();
        // One request in forty takes 40 times the usual 5 ms, as object stores' tails do
        // (rarer than one in twenty, so the 95th percentile is the usual wait).
        let tail =
            LatencyStore::new(Arc::clone(&b.raw), Duration::from_millis(5)).with_tail(40, 40, 7);
        let ctx = session(&lake);
        ctx.register_object_store(&b.store_url, Arc::new(tail) as Arc<dyn ObjectStore>);
        ctx.register_parquet("t", b.table_url(), ParquetReadOptions::default())
            .await
            .unwrap();
        assert_eq!(rows(&ctx, sql).await.unwrap(), want);
        let s = lake.stats().store;
        eprintln!("hedging {hedge:?}: {s:?}");
        match hedge {
            // By default: slow requests got copies, which answered for some of them, within
            // one copy per twenty requests.
            None => {
                assert!(s.hedged > 0 && s.hedges_won > 0, "{s:?}");
                assert!(s.hedged * 20 <= s.gets, "{s:?}");
            }
            Some(_) => assert_eq!((s.hedged, s.hedges_won), (0, 0), "{s:?}"),
        }
    }
}

/// A planner's own HEADs (of files its listing did not show) wait on the store as GETs do,
/// and a slow one holds up its query as a slow GET does: copied as a slow GET is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planners_slow_head_is_copied_as_a_slow_get_is() {
    let b = common::memory_backend();
    b.write(&LakeSpec::small_files(FILES)).await;
    let files: Vec<_> = b.raw.list(Some(&b.prefix)).try_collect().await.unwrap();
    let lake = LakeCache::builder().build().unwrap();
    // One request in forty takes 200 times the usual 5 ms; which ones is fixed by the seed,
    // as the HEADs go one at a time.
    let tail =
        LatencyStore::new(Arc::clone(&b.raw), Duration::from_millis(5)).with_tail(40, 200, 3);
    let ctx = session(&lake);
    ctx.register_object_store(&b.store_url, Arc::new(tail) as Arc<dyn ObjectStore>);
    let store = ctx
        .runtime_env()
        .object_store_registry
        .get_store(&b.store_url)
        .unwrap();
    for file in &files {
        let meta = store.head(&file.location).await.unwrap();
        assert_eq!(meta.size, file.size);
    }
    let s = lake.stats().store;
    assert_eq!(s.gets, 0, "HEADs only: {s:?}");
    assert!(s.hedged > 0, "a slow HEAD got a copy: {s:?}");
    assert!(
        s.hedged * 20 <= files.len() as u64,
        "within one in twenty: {s:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_identitys_slow_proof_head_is_copied_as_a_slow_get_is() {
    let b = common::memory_backend();
    b.write(&LakeSpec::small_files(FILES)).await;
    // E_tags that are digests of the bytes, as S3's: a version one identity read is shared
    // with the next for one HEAD.
    let digests = ContentETags::new(Arc::clone(&b.raw));
    digests.learn(None).await.unwrap();
    let digests: Arc<dyn ObjectStore> = Arc::new(digests);
    let sql = "SELECT category, count(*) FROM t GROUP BY category ORDER BY category";
    let want = scan(&b, Arc::clone(&digests), sql).await.unwrap();
    let lake = LakeCache::builder().build().unwrap();
    let first = session(&lake);
    first.register_object_store(&b.store_url, Arc::clone(&digests));
    first
        .register_parquet("t", b.table_url(), ParquetReadOptions::default())
        .await
        .unwrap();
    assert_eq!(rows(&first, sql).await.unwrap(), want);
    // Another identity over a store where one request in forty takes 200 times the usual
    // 5 ms: every byte it reads is cached, so it sends a LIST and a HEAD per file only.
    let tail =
        LatencyStore::new(Arc::clone(&digests), Duration::from_millis(5)).with_tail(40, 200, 3);
    let second = session(&lake);
    second.register_object_store(&b.store_url, Arc::new(tail) as Arc<dyn ObjectStore>);
    let before = lake.stats();
    second
        .register_parquet("t", b.table_url(), ParquetReadOptions::default())
        .await
        .unwrap();
    assert_eq!(rows(&second, sql).await.unwrap(), want);
    let after = lake.stats();
    let heads = after.handle.proof_heads - before.handle.proof_heads;
    assert_eq!(heads, FILES as u64, "a HEAD per file: {:?}", after.handle);
    assert_eq!(
        after.store.gets, before.store.gets,
        "no GET: {:?}",
        after.store
    );
    assert!(
        after.store.hedged > before.store.hedged,
        "a slow proof HEAD got a copy: {:?}",
        after.store
    );
}
