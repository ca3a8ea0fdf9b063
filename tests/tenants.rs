//! Sessions of one `LakeCache` that register different stores at one URL: a session only
//! ever gets cache hits for objects its own store has shown it can read, while sessions
//! with equivalent stores keep sharing footers and bytes. On the in-memory store and, when
//! configured, the S3 server.

mod common;

use std::sync::Arc;

use common::{Backend, WORKLOAD, remote_backends, rows, scan};
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::testkit::lake::LakeSpec;
use datafusion_lakecache::testkit::{CountingStore, FaultStore};
use object_store::{ObjectStore, ObjectStoreExt};

fn session(lake: &LakeCache) -> SessionContext {
    let builder = SessionStateBuilder::new()
        .with_default_features()
        .with_config(SessionConfig::new().with_target_partitions(2));
    SessionContext::new_with_state(lake.install(builder).unwrap().build())
}

/// A store over `b`'s that refuses every request, as one with other credentials would.
fn refusing(b: &Backend) -> Arc<FaultStore<Arc<dyn ObjectStore>>> {
    let store = Arc::new(FaultStore::new(Arc::clone(&b.raw)));
    store.refuse_all(true);
    store
}

/// What a refused session may see: an error, never rows of the lake.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_store_refuses_gets_no_rows_of_another_sessions_store() {
    for b in remote_backends("tenants_refused") {
        b.write(&LakeSpec::small_files(4)).await;
        let lake = LakeCache::builder().build().unwrap();
        let sql = WORKLOAD[2];
        let owner = session(&lake);
        owner.register_object_store(&b.store_url, Arc::clone(&b.raw));
        owner
            .register_parquet("t", b.table_url(), ParquetReadOptions::default())
            .await
            .unwrap();
        let want = scan(&b, Arc::clone(&b.raw), sql).await.unwrap();
        // Twice: every listing, footer and byte of the lake is cached now.
        for _ in 0..2 {
            assert_eq!(rows(&owner, sql).await.unwrap(), want, "{}", b.name);
        }
        let other = session(&lake);
        let store = refusing(&b);
        other.register_object_store(&b.store_url, store.clone());
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
        ctx.register_object_store(&b.store_url, refusing(&b));
        let err = rows(&ctx, sql).await.expect_err("the new store refuses");
        assert!(err.to_string().contains("refused"), "{}: {err}", b.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_with_equivalent_stores_share_footers_and_bytes() {
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
            // A later session proves access with its own listing, then shares the rest.
            assert_eq!(registered.list, 1, "{}: {registered:?}", b.name);
            assert_eq!(
                registered.get + registered.head,
                0,
                "{}: {registered:?}",
                b.name
            );
            assert_eq!(
                query.get + query.head + query.list,
                0,
                "{}: {query:?}",
                b.name
            );
        }
    }
}
