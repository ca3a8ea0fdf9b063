//! One `LakeCache` shared by sessions whose stores differ: a session gets a cache hit only
//! for an object version its own store has shown it can read (a HEAD or a GET it answered),
//! reads at versions its own store recorded, and never sees another store's failures; stores
//! that show the same versions keep sharing footers and bytes. On the in-memory store (with
//! counter e_tags, and with content digests as S3 gives) and, when configured, the S3 server.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Backend, WORKLOAD, remote_backends, rows, s3_backend, scan, sorted_lines};
use datafusion::datasource::listing::{ListingTable, ListingTableConfig, ListingTableUrl};
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::options::ReadOptions;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use datafusion_lakecache::testkit::lake::{LakeSpec, same_layout_file};
use datafusion_lakecache::testkit::{ContentETags, CountingStore, FaultStore, LatencyStore, Op};
use datafusion_lakecache::{CachingObjectStore, LakeCache, LakeTable, StoreIdentity};
use futures::StreamExt;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use url::Url;

fn config() -> SessionConfig {
    SessionConfig::new().with_target_partitions(2)
}

fn session(lake: &LakeCache) -> SessionContext {
    session_with(lake, config())
}

fn session_with(lake: &LakeCache, config: SessionConfig) -> SessionContext {
    let builder = SessionStateBuilder::new()
        .with_default_features()
        .with_config(config);
    SessionContext::new_with_state(lake.install(builder).unwrap().build())
}

/// A store over `b`'s that refuses the requests of the kinds `ops`, as one whose credentials
/// do not allow them would.
fn refusing(b: &Backend, ops: &[Op]) -> Arc<FaultStore<Arc<dyn ObjectStore>>> {
    let store = Arc::new(FaultStore::new(Arc::clone(&b.raw)));
    store.refuse(ops);
    store
}

/// What a refused session may see: an error naming the refusal, never rows of the lake.
async fn refused(ctx: &SessionContext, b: &Backend, sql: &str) {
    let registered = ctx
        .register_parquet("t", b.table_url(), ParquetReadOptions::default())
        .await;
    if let Err(e) = registered {
        assert!(e.to_string().contains("refused"), "{}: {e}", b.name);
        return;
    }
    let err = rows(ctx, sql)
        .await
        .expect_err("no rows for a refused store");
    assert!(err.to_string().contains("refused"), "{}: {err}", b.name);
}

/// Fills every cache with `b`'s lake through a session of its own store, and returns the
/// owner's session and the rows of `sql`.
async fn owner(b: &Backend, lake: &LakeCache, sql: &str) -> (SessionContext, Vec<String>) {
    let owner = session(lake);
    owner.register_object_store(&b.store_url, Arc::clone(&b.raw));
    owner
        .register_parquet("t", b.table_url(), ParquetReadOptions::default())
        .await
        .unwrap();
    let want = scan(b, Arc::clone(&b.raw), sql).await.unwrap();
    // Twice: every listing, footer and byte of the lake is cached now.
    for _ in 0..2 {
        assert_eq!(rows(&owner, sql).await.unwrap(), want, "{}", b.name);
    }
    (owner, want)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_store_refuses_everything_gets_no_rows_of_another_sessions_store() {
    for b in remote_backends("tenants_refused") {
        b.write(&LakeSpec::small_files(4)).await;
        let lake = LakeCache::builder().build().unwrap();
        let sql = WORKLOAD[2];
        let (owner, want) = owner(&b, &lake, sql).await;
        let other = session(&lake);
        other.register_object_store(&b.store_url, refusing(&b, &[Op::Head, Op::Get, Op::List]));
        refused(&other, &b, sql).await;
        // Its store's plain API is refused too, however much the caches hold.
        let path = b.prefix.clone().join(LakeSpec::file_name(0));
        let registered = other
            .runtime_env()
            .object_store_registry
            .get_store(&b.store_url)
            .unwrap();
        assert!(registered.head(&path).await.is_err(), "{}", b.name);
        assert!(
            registered.get_range(&path, 0..4).await.is_err(),
            "{}",
            b.name
        );
        // The owner still reads.
        assert_eq!(rows(&owner, sql).await.unwrap(), want, "{}", b.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_may_list_but_not_read_gets_no_rows_and_no_metadata_of_anothers_cache() {
    for b in remote_backends("tenants_list_only") {
        b.write(&LakeSpec::small_files(4)).await;
        let lake = LakeCache::builder().build().unwrap();
        let sql = "SELECT count(*), sum(id) FROM t";
        let (owner, want) = owner(&b, &lake, sql).await;
        let hits = lake.stats().handle.metadata.hits;
        // S3's s3:ListBucket without s3:GetObject: the listing is answered, reads are not.
        let other = session(&lake);
        let list_only = refusing(&b, &[Op::Head, Op::Get]);
        other.register_object_store(&b.store_url, list_only.clone());
        refused(&other, &b, sql).await;
        // Its schema cannot come from the owner's footers either: with one given, the
        // table registers (a listing is all it takes) and the query is still refused.
        let schema = datafusion_lakecache::testkit::lake::schema();
        let options = ParquetReadOptions::default().schema(&schema);
        let given = session(&lake);
        given.register_object_store(&b.store_url, list_only.clone());
        given
            .register_parquet("t", b.table_url(), options)
            .await
            .unwrap();
        let err = rows(&given, sql).await.expect_err("refused");
        assert!(err.to_string().contains("refused"), "{}: {err}", b.name);
        // Nor does its HEAD get the owner's metadata.
        let registered = given
            .runtime_env()
            .object_store_registry
            .get_store(&b.store_url)
            .unwrap();
        let path = b.prefix.clone().join(LakeSpec::file_name(0));
        let err = registered.head(&path).await.unwrap_err();
        assert!(err.to_string().contains("refused"), "{}: {err}", b.name);
        assert_eq!(
            lake.stats().handle.metadata.hits,
            hits,
            "{}: no metadata was served to it",
            b.name
        );
        assert_eq!(rows(&owner, sql).await.unwrap(), want, "{}", b.name);
    }
}

/// A session that was never installed, with `b`'s table as a `LakeTable` of the given
/// schema over `store` as registered (not wrapped by the caches: its reads are the ones
/// the caches make over a store they did not wrap).
async fn unwrapped_session(
    b: &Backend,
    store: Arc<dyn ObjectStore>,
    lake: &LakeCache,
) -> SessionContext {
    let ctx = SessionContext::new_with_config(config());
    ctx.register_object_store(&b.store_url, store);
    let options = ParquetReadOptions::default()
        .to_listing_options(&ctx.copied_config(), ctx.copied_table_options());
    let listing = ListingTableConfig::new(ListingTableUrl::parse(b.table_url()).unwrap())
        .with_listing_options(options)
        .with_schema(datafusion_lakecache::testkit::lake::schema());
    let table = LakeTable::new(Arc::new(ListingTable::try_new(listing).unwrap()), lake);
    ctx.register_table("t", Arc::new(table)).unwrap();
    ctx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lake_table_over_a_store_the_caches_never_wrapped_gets_nothing_its_store_refuses() {
    for b in remote_backends("tenants_unwrapped") {
        b.write(&LakeSpec::small_files(4)).await;
        let lake = LakeCache::builder().build().unwrap();
        let sql = "SELECT count(*), sum(id) FROM t WHERE name <> 'nobody'";
        let want = scan(&b, Arc::clone(&b.raw), sql).await.unwrap();
        // The owner's reads fill the index cache with every footer.
        let owner = unwrapped_session(&b, Arc::clone(&b.raw), &lake).await;
        for _ in 0..2 {
            assert_eq!(rows(&owner, sql).await.unwrap(), want, "{}", b.name);
        }
        let footers = lake.stats().index.footers;
        assert!(footers.hits > 0, "{}: {footers:?}", b.name);
        // A store that may list but not read, registered as it is.
        let other = unwrapped_session(&b, refusing(&b, &[Op::Head, Op::Get]), &lake).await;
        let err = rows(&other, sql)
            .await
            .expect_err("no rows for a refused store");
        assert!(err.to_string().contains("refused"), "{}: {err}", b.name);
        assert_eq!(
            lake.stats().index.footers.hits,
            footers.hits,
            "{}: no footer was served to it",
            b.name
        );
        // A store of its own that can read gets the same answer.
        let reader = unwrapped_session(&b, b.counting(), &lake).await;
        assert_eq!(rows(&reader, sql).await.unwrap(), want, "{}", b.name);
        assert_eq!(rows(&owner, sql).await.unwrap(), want, "{}", b.name);
    }
}

/// Stores registered at one URL holding different objects at the same paths: `(label, URL,
/// stores)`. In memory with counter e_tags (every store numbers its writes alike, so the same
/// path, size and e_tag name different bytes), in memory with content digests, and on the S3
/// server (a `PrefixStore` per tenant over one bucket).
type AtOneUrl = (String, Url, [Arc<dyn ObjectStore>; 3]);

fn stores_at_one_url(test: &str) -> Vec<AtOneUrl> {
    let memory = Url::parse("memory://").unwrap();
    let counters = || Arc::new(InMemory::new()) as Arc<dyn ObjectStore>;
    let digests = || Arc::new(ContentETags::new(InMemory::new())) as Arc<dyn ObjectStore>;
    let mut all = vec![
        (
            "memory, counter e_tags".to_string(),
            memory.clone(),
            [counters(), counters(), counters()],
        ),
        (
            "memory, content digests".to_string(),
            memory,
            [digests(), digests(), digests()],
        ),
    ];
    if let Some(s3) = s3_backend(test) {
        let tenant = |name: &str| {
            let prefix = s3.prefix.clone().join(name);
            Arc::new(PrefixStore::new(Arc::clone(&s3.raw), prefix)) as Arc<dyn ObjectStore>
        };
        let stores = [tenant("a"), tenant("b"), tenant("c")];
        all.push((
            "s3, a prefix per tenant".to_string(),
            s3.store_url.clone(),
            stores,
        ));
    }
    all
}

/// Writes 4 same-layout files of `rows` rows under `t/`, with values from `seed`.
async fn write_tenant(store: &dyn ObjectStore, rows: usize, seed: u64) {
    for i in 0..4 {
        let bytes = same_layout_file(rows, seed + i).unwrap();
        let path = Path::from(format!("t/f{i}.parquet"));
        store.put(&path, PutPayload::from(bytes)).await.unwrap();
    }
}

/// The table `t/` of the store at `url`.
fn tenant_table(url: &Url) -> String {
    format!("{}/t/", url.as_str().trim_end_matches('/'))
}

/// `sql` over `t/` of `store` at `url` in plain DataFusion.
async fn vanilla(url: &Url, store: Arc<dyn ObjectStore>, sql: &str) -> Vec<String> {
    let ctx = SessionContext::new();
    ctx.register_object_store(url, store);
    ctx.register_parquet("t", tenant_table(url), ParquetReadOptions::default())
        .await
        .unwrap();
    sorted_lines(&ctx.sql(sql).await.unwrap().collect().await.unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_at_one_url_holding_different_objects_each_read_their_own() {
    let sql = "SELECT count(*), sum(value) FROM t";
    for (label, url, stores) in stores_at_one_url("tenants_one_url") {
        // The first two: the same names and sizes, other values; the third, larger files.
        write_tenant(stores[0].as_ref(), 2_000, 1).await;
        write_tenant(stores[1].as_ref(), 2_000, 100).await;
        write_tenant(stores[2].as_ref(), 3_000, 200).await;
        let mut want = Vec::new();
        for s in &stores {
            want.push(vanilla(&url, Arc::clone(s), sql).await);
        }
        assert_ne!(want[0], want[1], "{label}: the lakes differ");
        let lake = LakeCache::builder().build().unwrap();
        let mut sessions = Vec::new();
        for s in &stores {
            let ctx = session(&lake);
            ctx.register_object_store(&url, Arc::clone(s));
            ctx.register_parquet("t", tenant_table(&url), ParquetReadOptions::default())
                .await
                .unwrap_or_else(|e| panic!("{label}: {e}"));
            sessions.push(ctx);
        }
        for round in 0..3 {
            for (i, ctx) in sessions.iter().enumerate() {
                let got = rows(ctx, sql)
                    .await
                    .unwrap_or_else(|e| panic!("{label}: {e}"));
                assert_eq!(got, want[i], "{label}: round {round}, store {i}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_of_a_load_that_failed_on_another_stores_refusal_answers_from_its_own_store() {
    for b in remote_backends("tenants_waiter") {
        b.write(&LakeSpec::small_files(4)).await;
        let sql = "SELECT count(*), sum(id) FROM t";
        let want = scan(&b, Arc::clone(&b.raw), sql).await.unwrap();
        let lake = LakeCache::builder()
            .index_on_listing(false)
            .build()
            .unwrap();
        // Registration and planning read no footer (nothing is loaded for a listing, the
        // schema is given, statistics are not collected), so footers are loaded by the
        // scans, through the index cache's single flight.
        let config = config().with_collect_statistics(false);
        let schema = datafusion_lakecache::testkit::lake::schema();
        let register = |ctx: SessionContext, store: Arc<dyn ObjectStore>| {
            let (b, schema) = (&b, &schema);
            async move {
                ctx.register_object_store(&b.store_url, store);
                let options = ParquetReadOptions::default().schema(schema);
                ctx.register_parquet("t", b.table_url(), options)
                    .await
                    .unwrap();
                ctx
            }
        };
        // The refused store answers slowly, so that its footer loads are in the air when the
        // reader's scan asks for the same footers.
        let slow_refusal = LatencyStore::new(refusing(&b, &[Op::Get]), Duration::from_millis(300));
        let refused_ctx =
            register(session_with(&lake, config.clone()), Arc::new(slow_refusal)).await;
        let reader_ctx = register(session_with(&lake, config.clone()), Arc::clone(&b.raw)).await;
        let refused_query = tokio::spawn(async move { rows(&refused_ctx, sql).await });
        while lake.stats().index.loads_in_flight == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let got = rows(&reader_ctx, sql).await;
        let err = refused_query.await.unwrap().expect_err("refused");
        assert!(err.to_string().contains("refused"), "{}: {err}", b.name);
        assert_eq!(
            got.expect("the reader's own store answers"),
            want,
            "{}",
            b.name
        );
        let reloads = lake.stats().index.reloads;
        assert!(
            reloads >= 1,
            "{}: it joined a refused load and loaded again",
            b.name
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joiner_of_a_shared_download_finishes_while_the_leaders_consumer_stops_polling() {
    for b in remote_backends("tenants_stalled_leader") {
        b.write(&LakeSpec::small_files(1)).await;
        let sql = "SELECT * FROM t";
        let want = scan(&b, Arc::clone(&b.raw), sql).await.unwrap();
        let lake = LakeCache::builder().build().unwrap();
        // One store, slow enough that a download is in the air when the second session asks.
        let counted = Arc::new(CountingStore::new(LatencyStore::new(
            Arc::clone(&b.raw),
            Duration::from_millis(400),
        )));
        // Planning reads nothing; readers read for themselves (no prefetching), footers apart
        // from the data.
        let config = config()
            .with_target_partitions(1)
            .with_collect_statistics(false)
            .set_usize("datafusion.execution.parquet.metadata_size_hint", 4096);
        let schema = datafusion_lakecache::testkit::lake::schema();
        let mut sessions = Vec::new();
        for _ in 0..2 {
            let ctx = session_with(&lake, config.clone());
            ctx.sql("SET lakecache.prefetch.enabled = false")
                .await
                .unwrap();
            ctx.register_object_store(&b.store_url, counted.clone());
            let options = ParquetReadOptions::default().schema(&schema);
            ctx.register_parquet("t", b.table_url(), options)
                .await
                .unwrap();
            sessions.push(ctx);
        }
        // The leader's consumer pulls until its footer is loaded and its data download has
        // reached the store, then stops pulling (keeping the stream), as a client applying
        // backpressure does.
        let mut leader = sessions[0]
            .sql(sql)
            .await
            .unwrap()
            .execute_stream()
            .await
            .unwrap();
        // (The footer fits the 4 KiB hint: one GET; the data is the second.)
        let mut polls = 0;
        loop {
            let _ = tokio::time::timeout(Duration::from_millis(10), leader.next()).await;
            let (index, gets) = (lake.stats().index, counted.counts().get);
            if index.footer_loads == 1 && index.loads_in_flight == 0 && gets >= 2 {
                break;
            }
            polls += 1;
            assert!(polls < 2_000, "{}: the leader never read its data", b.name);
        }
        let at_stop = counted.counts().get;
        let joined = tokio::time::timeout(Duration::from_secs(20), rows(&sessions[1], sql)).await;
        let got = joined.unwrap_or_else(|_| panic!("{}: the joiner waited for the leader", b.name));
        assert_eq!(got.unwrap(), want, "{}", b.name);
        assert_eq!(
            counted.counts().get,
            at_stop,
            "{}: the joiner joined, no GET of its own",
            b.name
        );
        drop(leader);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_registered_again_at_a_url_starts_with_nothing_proven() {
    for b in remote_backends("tenants_reregistered") {
        b.write(&LakeSpec::small_files(4)).await;
        let lake = LakeCache::builder().build().unwrap();
        let sql = WORKLOAD[0];
        let ctx = session(&lake);
        ctx.register_object_store(&b.store_url, Arc::clone(&b.raw));
        ctx.register_parquet("t", b.table_url(), ParquetReadOptions::default())
            .await
            .unwrap();
        rows(&ctx, sql).await.unwrap();
        ctx.register_object_store(&b.store_url, refusing(&b, &[Op::Head, Op::Get, Op::List]));
        let err = rows(&ctx, sql).await.expect_err("the new store refuses");
        assert!(err.to_string().contains("refused"), "{}: {err}", b.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unrelated_stores_showing_the_same_versions_share_footers_and_bytes_for_a_head_each() {
    for b in remote_backends("tenants_shared") {
        let files = 8;
        b.write(&LakeSpec::small_files(files)).await;
        let lake = LakeCache::builder().build().unwrap();
        let sql = WORKLOAD[2];
        let want = scan(&b, Arc::clone(&b.raw), sql).await.unwrap();
        // A server making a store per session: each session its own instance, one backend.
        let mut costs = Vec::new();
        for s in 0..3 {
            let counted = Arc::new(CountingStore::new(Arc::clone(&b.raw)));
            let ctx = session(&lake);
            ctx.register_object_store(&b.store_url, counted.clone());
            ctx.register_parquet("t", b.table_url(), ParquetReadOptions::default())
                .await
                .unwrap();
            let registered = counted.counts();
            counted.reset();
            assert_eq!(
                rows(&ctx, sql).await.unwrap(),
                want,
                "{} session {s}",
                b.name
            );
            costs.push((registered, counted.counts()));
        }
        eprintln!(
            "{}: per session (registration, first query): {costs:?}",
            b.name
        );
        let s = lake.stats();
        assert_eq!(
            s.index.footer_loads, files as u64,
            "{}: footers loaded once",
            b.name
        );
        for (registered, query) in &costs[1..] {
            // A later session lists for itself and proves access with a HEAD per file (a
            // listing shows names, not that they can be read), then shares the rest.
            assert_eq!(registered.list, 1, "{}: {registered:?}", b.name);
            assert_eq!(registered.get, 0, "{}: {registered:?}", b.name);
            assert_eq!(registered.head, files as u64, "{}: {registered:?}", b.name);
            assert_eq!(query.total(), 0, "{}: {query:?}", b.name);
        }
        assert_eq!(
            s.handle.proof_heads,
            2 * files as u64,
            "{}: counted",
            b.name
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_declared_one_identity_share_everything_without_a_request() {
    for b in remote_backends("tenants_one_identity") {
        let files = 8;
        b.write(&LakeSpec::small_files(files)).await;
        let lake = LakeCache::builder().build().unwrap();
        let sql = WORKLOAD[2];
        let want = scan(&b, Arc::clone(&b.raw), sql).await.unwrap();
        let identity = StoreIdentity::named("lake reader");
        let mut costs = Vec::new();
        for s in 0..3 {
            let counted = Arc::new(CountingStore::new(Arc::clone(&b.raw)));
            let store = CachingObjectStore::new_arc(counted.clone(), &b.store_url, &lake)
                .with_identity(identity.clone());
            let ctx = session(&lake);
            ctx.register_object_store(&b.store_url, Arc::new(store));
            ctx.register_parquet("t", b.table_url(), ParquetReadOptions::default())
                .await
                .unwrap();
            assert_eq!(
                rows(&ctx, sql).await.unwrap(),
                want,
                "{} session {s}",
                b.name
            );
            costs.push(counted.counts());
        }
        eprintln!("{}: requests per session: {costs:?}", b.name);
        for later in &costs[1..] {
            assert_eq!(later.total(), 0, "{}: {later:?}", b.name);
        }
    }
}
