//! Delta Lake tables through the caches (`delta` feature), on a local directory and on the S3
//! server: after every commit (appends, a delete, an overwrite, a checkpoint) an installed
//! session answers exactly what delta-rs answers alone; repeated queries of an unchanged
//! table make no request; a new commit is seen by the next snapshot load.
#![cfg(feature = "delta")]

mod common;
#[path = "common/delta.rs"]
mod delta_tables;

use std::sync::Arc;

use common::{Backend, Cached, Counted, backends, rows};
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::SessionContext;
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::delta::register_default_log_stores;
use delta_tables::{batch, delete_with_deletion_vectors, delta_rs_rows, table_url, uncached};
use deltalake_core::DeltaTable;
use deltalake_core::protocol::SaveMode;
use object_store::ObjectStore;

/// Queries with filters, projections and aggregates.
const QUERIES: [&str; 5] = [
    "SELECT count(*), sum(id), min(name), max(name) FROM t",
    "SELECT id, name, value FROM t WHERE id BETWEEN 1200 AND 1260",
    "SELECT category, count(*), round(sum(value), 3) FROM t GROUP BY category",
    "SELECT name FROM t WHERE category = 'beta' AND id % 97 = 1",
    "SELECT count(*) FROM t WHERE note IS NULL",
];

/// The table loaded through `lake`'s caches over `counted`.
async fn cached(b: &Backend, lake: &LakeCache, counted: &Arc<Counted>) -> DeltaTable {
    register_default_log_stores();
    let store = Arc::clone(counted) as Arc<dyn ObjectStore>;
    datafusion_lakecache::delta::table_builder(lake, &table_url(b), store)
        .unwrap()
        .load()
        .await
        .unwrap()
}

/// A session installed from `lake` where `t` is `table`, read through `store`.
async fn installed(
    b: &Backend,
    lake: &LakeCache,
    store: &Arc<Cached>,
    table: &DeltaTable,
) -> SessionContext {
    let builder = SessionStateBuilder::new().with_default_features();
    let ctx = SessionContext::new_with_state(lake.install(builder).unwrap().build());
    ctx.register_object_store(&b.store_url, Arc::clone(store) as Arc<dyn ObjectStore>);
    ctx.register_table("t", table.table_provider().await.unwrap())
        .unwrap();
    ctx
}

/// Runs every query of [`QUERIES`] in `ctx`.
async fn run_all(ctx: &SessionContext) {
    for sql in QUERIES {
        rows(ctx, sql).await.unwrap();
    }
}

/// Asserts that no request reached `counted` since its last reset.
fn assert_no_requests(b: &Backend, counted: &Counted) {
    let c = counted.counts();
    assert_eq!(
        (c.head, c.list, c.get),
        (0, 0, 0),
        "{}: {c:?} {:?}",
        b.name,
        counted.gets()
    );
}

/// What delta-rs alone answers for every query, at the table's latest version.
async fn expected(b: &Backend) -> Vec<Vec<String>> {
    delta_rs_rows(b, &QUERIES).await
}

async fn check(b: &Backend, lake: &LakeCache, counted: &Arc<Counted>, after: &str) {
    let want = expected(b).await;
    // Twice, each in a new session over a new snapshot load: cold, then from the caches.
    let store = b.cached(counted, lake);
    for round in 0..2 {
        let table = cached(b, lake, counted).await;
        let ctx = installed(b, lake, &store, &table).await;
        for (sql, want) in QUERIES.iter().zip(&want) {
            let got = rows(&ctx, sql).await.unwrap();
            assert_eq!(
                &got, want,
                "{}: after {after}, round {round}: {sql}",
                b.name
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_commit_reads_as_delta_rs_reads_it() {
    for b in backends("delta_commits") {
        let lake = LakeCache::builder().build().unwrap();
        let counted = b.counting();
        let table = uncached(&b).write(vec![batch(0)]).await.unwrap();
        check(&b, &lake, &counted, "the first write").await;
        let table = table
            .write(vec![batch(1), batch(2)])
            .with_save_mode(SaveMode::Append)
            .await
            .unwrap();
        check(&b, &lake, &counted, "an append").await;
        let (table, _) = table.delete().with_predicate("id % 5 = 0").await.unwrap();
        check(&b, &lake, &counted, "a delete").await;
        let table = table
            .write(vec![batch(3)])
            .with_save_mode(SaveMode::Overwrite)
            .await
            .unwrap();
        check(&b, &lake, &counted, "an overwrite").await;
        deltalake_core::checkpoints::create_checkpoint(&table, None)
            .await
            .unwrap();
        check(&b, &lake, &counted, "a checkpoint").await;
        table
            .write(vec![batch(4)])
            .with_save_mode(SaveMode::Append)
            .await
            .unwrap();
        check(&b, &lake, &counted, "an append after the checkpoint").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_queries_of_an_unchanged_table_make_no_request() {
    for b in backends("delta_repeated") {
        let lake = LakeCache::builder().build().unwrap();
        let counted = b.counting();
        let mut table = uncached(&b).write(vec![batch(0)]).await.unwrap();
        for i in 1..4 {
            table = table
                .write(vec![batch(i)])
                .with_save_mode(SaveMode::Append)
                .await
                .unwrap();
        }
        deltalake_core::checkpoints::create_checkpoint(&table, None)
            .await
            .unwrap();
        table
            .write(vec![batch(4)])
            .with_save_mode(SaveMode::Append)
            .await
            .unwrap();

        // The first load and queries read the log and the files: no HEAD for a data file
        // (their versions come from the log).
        let table = cached(&b, &lake, &counted).await;
        // One store for the process's sessions, as a server registers it: it has shown it
        // can read each file once (a store made per session proves it again, with one HEAD
        // per file; see docs/architecture.md, Tenants).
        let store = b.cached(&counted, &lake);
        let first = installed(&b, &lake, &store, &table).await;
        counted.reset();
        run_all(&first).await;
        let cold = counted.counts();
        if b.name != "local" {
            // (Local data files are read through cached descriptors, not the counted store.)
            assert!(cold.get > 0, "{}: {cold:?}", b.name);
            // The rule gave the Delta scan its prefetcher.
            let prefetch = lake.stats().prefetch;
            assert!(prefetch.requests > 0, "{}: {prefetch:?}", b.name);
        }
        assert_eq!(cold.head, 0, "{}: no HEAD: {cold:?}", b.name);

        // The same snapshot in a new session: nothing reaches the store.
        counted.reset();
        let again = installed(&b, &lake, &store, &table).await;
        run_all(&again).await;
        assert_no_requests(&b, &counted);

        // A new snapshot load of the unchanged table asks the store only what may have
        // changed: `_last_checkpoint` and the log's listing; commits and the checkpoint come
        // from the caches.
        counted.reset();
        let reloaded = cached(&b, &lake, &counted).await;
        let ctx = installed(&b, &lake, &store, &reloaded).await;
        run_all(&ctx).await;
        if b.name == "local" {
            // Bytes of local files are not kept (they are read through cached descriptors).
            continue;
        }
        let gets: Vec<String> = counted
            .gets()
            .into_iter()
            .map(|(path, _)| path.to_string())
            .collect();
        assert!(
            gets.iter()
                .all(|p| p.ends_with("_delta_log/_last_checkpoint")),
            "{}: only the pointer to the checkpoint is read again: {gets:?}",
            b.name
        );
        assert_eq!(counted.counts().head, 0, "{}", b.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_commit_is_seen_by_the_next_load() {
    for b in backends("delta_new_commit") {
        let lake = LakeCache::builder().build().unwrap();
        let counted = b.counting();
        let table = uncached(&b).write(vec![batch(0)]).await.unwrap();
        let count = "SELECT count(*) FROM t";
        let store = b.cached(&counted, &lake);
        let loaded = cached(&b, &lake, &counted).await;
        let ctx = installed(&b, &lake, &store, &loaded).await;
        let before = rows(&ctx, count).await.unwrap();

        table
            .write(vec![batch(1)])
            .with_save_mode(SaveMode::Append)
            .await
            .unwrap();
        // Well within the handle TTL and the listing TTL: the next load sees the commit.
        let reloaded = cached(&b, &lake, &counted).await;
        assert_eq!(reloaded.version(), Some(1), "{}", b.name);
        let ctx = installed(&b, &lake, &store, &reloaded).await;
        let after = rows(&ctx, count).await.unwrap();
        assert_ne!(before, after, "{}", b.name);
        let want = {
            let ctx = SessionContext::new();
            ctx.register_object_store(&b.store_url, Arc::clone(&b.raw));
            let mut t = uncached(&b);
            t.load().await.unwrap();
            ctx.register_table("t", t.table_provider().await.unwrap())
                .unwrap();
            rows(&ctx, count).await.unwrap()
        };
        assert_eq!(after, want, "{}", b.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_with_deletion_vectors_reads_as_delta_rs_reads_it() {
    for b in backends("delta_dv") {
        let lake = LakeCache::builder().build().unwrap();
        let counted = b.counting();
        let table = uncached(&b).write(vec![batch(0)]).await.unwrap();
        table
            .write(vec![batch(1), batch(2)])
            .with_save_mode(SaveMode::Append)
            .await
            .unwrap();
        let before = expected(&b).await;
        let deleted = delete_with_deletion_vectors(&b, 1, |id| id % 7 == 3).await;
        assert!(deleted > 0);
        let after = expected(&b).await;
        // delta-rs applies the vectors: the count (the first figure of the first query's
        // row) dropped by exactly the deleted rows.
        let n = |rows: &[String]| -> usize {
            rows.iter()
                .find_map(|l| l.split('|').nth(1)?.trim().parse().ok())
                .unwrap()
        };
        assert_eq!(n(&before[0]) - n(&after[0]), deleted, "{}", b.name);
        check(&b, &lake, &counted, "a delete with deletion vectors").await;

        // Repeated queries of the unchanged table: nothing reaches the store.
        let table = cached(&b, &lake, &counted).await;
        let store = b.cached(&counted, &lake);
        let first = installed(&b, &lake, &store, &table).await;
        run_all(&first).await;
        counted.reset();
        let again = installed(&b, &lake, &store, &table).await;
        run_all(&again).await;
        assert_no_requests(&b, &counted);
    }
}
