//! `LakeCache::install`: a session whose Parquet tables are LakeTables and whose object
//! stores are cached, however the tables and stores are registered.

mod common;

use common::{WORKLOAD, backends, scan, sorted_lines};
use datafusion::arrow::array::UInt64Array;
use datafusion::datasource::listing::ListingTable;
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{CsvReadOptions, ParquetReadOptions, SessionContext};
use datafusion_lakecache::testkit::lake::LakeSpec;
use datafusion_lakecache::{LakeCache, LakeTable};

fn session(lake: &LakeCache) -> SessionContext {
    let state = lake
        .install(SessionStateBuilder::new().with_default_features())
        .unwrap()
        .build();
    SessionContext::new_with_state(state)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_sessions_use_lake_tables_and_cached_stores() {
    for b in backends("install") {
        b.write(&LakeSpec::small_files(4).with_row_groups_of(1_000))
            .await;
        let lake = LakeCache::builder().build().unwrap();
        let counted = b.counting();
        let want = scan(&b, b.raw.clone(), WORKLOAD[0]).await.unwrap();

        for round in 0..2 {
            // A new session each round, installed from the same LakeCache: caches are shared.
            let ctx = session(&lake);
            ctx.register_object_store(&b.store_url, counted.clone());
            ctx.register_parquet("t", b.table_url(), ParquetReadOptions::default())
                .await
                .unwrap();
            let sql = format!(
                "CREATE EXTERNAL TABLE u STORED AS PARQUET LOCATION '{}'",
                b.table_url()
            );
            ctx.sql(&sql).await.unwrap();
            for name in ["t", "u"] {
                let provider = ctx.table_provider(name).await.unwrap();
                assert!(
                    provider.downcast_ref::<LakeTable>().is_some(),
                    "{}: {name} is a LakeTable",
                    b.name
                );
            }
            counted.reset();
            for name in ["t", "u"] {
                let batches = ctx
                    .sql(&WORKLOAD[0].replace("FROM t", &format!("FROM {name} AS t")))
                    .await
                    .unwrap()
                    .collect()
                    .await
                    .unwrap();
                let lines = sorted_lines(&batches).unwrap();
                assert_eq!(lines, want, "{} round {round}: {name}", b.name);
            }
            let c = counted.counts();
            assert_eq!(
                (c.head, c.list),
                (0, 0),
                "{} round {round}: no HEAD or LIST: {c:?}",
                b.name
            );
        }
        let stats = lake.stats();
        assert_eq!(
            stats.index.footer_loads, 4,
            "4 files, loaded once for both sessions' scans (DataFusion's planning keeps its \
             own footers per session)"
        );
        assert!(stats.handle.listings.hits > 0);
    }
}

/// Planning (schema inference, every file's statistics) takes the footers DataFusion's own
/// cache no longer holds from the index cache: with DataFusion's caches emptied (as their
/// bounds would empty them of a large table) and no range cache to serve the footers' bytes,
/// registering the table again reads nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planning_takes_the_footers_datafusion_no_longer_holds_from_the_index_cache() {
    for b in backends("install_planning") {
        b.write(&LakeSpec::small_files(4)).await;
        let lake = LakeCache::builder().range_cache(false).build().unwrap();
        let counted = b.counting();
        let want = scan(&b, b.raw.clone(), WORKLOAD[0]).await.unwrap();
        let ctx = session(&lake);
        ctx.register_object_store(&b.store_url, counted.clone());
        for round in 0..2 {
            let caches = &ctx.runtime_env().cache_manager;
            caches.get_file_metadata_cache().clear();
            if let Some(statistics) = caches.get_file_statistic_cache() {
                statistics.clear();
            }
            counted.reset();
            let before = lake.stats().index.planning_hits;
            let table = format!("t{round}");
            ctx.register_parquet(&table, b.table_url(), ParquetReadOptions::default())
                .await
                .unwrap();
            let c = counted.counts();
            let served = lake.stats().index.planning_hits - before;
            if round == 1 {
                assert_eq!(c.get, 0, "{}: no footer read again: {c:?}", b.name);
                assert!(served >= 4, "{}: every footer from the index cache", b.name);
            }
            let sql = WORKLOAD[0].replace("FROM t", &format!("FROM {table} AS t"));
            let batches = ctx.sql(&sql).await.unwrap().collect().await.unwrap();
            assert_eq!(
                sorted_lines(&batches).unwrap(),
                want,
                "{} round {round}",
                b.name
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_formats_stay_listing_tables() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("a.csv");
    std::fs::write(&csv, "x,y\n1,2\n3,4\n").unwrap();
    let lake = LakeCache::builder().build().unwrap();
    let ctx = session(&lake);
    ctx.register_csv("c", csv.to_str().unwrap(), CsvReadOptions::new())
        .await
        .unwrap();
    let provider = ctx.table_provider("c").await.unwrap();
    assert!(provider.downcast_ref::<ListingTable>().is_some());
    let batches = ctx
        .sql("SELECT sum(y) FROM c")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(batches[0].num_rows(), 1);
}

/// A bloom-filtered point lookup over a small lake.
const LOOKUP: &str = "SELECT id FROM t WHERE name = 'name-012345'";

/// A session installed from `lake` over a lake of 3 files (kept alive by the returned
/// backend), after one [`LOOKUP`].
async fn after_a_lookup(lake: &LakeCache) -> (common::Backend, SessionContext) {
    let b = common::local_backend();
    b.write(&LakeSpec::small_files(3).with_row_groups_of(1_000))
        .await;
    let ctx = session(lake);
    ctx.register_parquet("t", b.table_url(), ParquetReadOptions::default())
        .await
        .unwrap();
    ctx.sql(LOOKUP).await.unwrap().collect().await.unwrap();
    (b, ctx)
}

/// One figure from `lakecache_metrics()`.
async fn figure(ctx: &SessionContext, cache: &str, metric: &str) -> u64 {
    let sql = format!(
        "SELECT value FROM lakecache_metrics() WHERE cache = '{cache}' AND metric = '{metric}'"
    );
    let batches = ctx.sql(&sql).await.unwrap().collect().await.unwrap();
    let column = batches[0]
        .column(0)
        .as_any()
        .downcast_ref::<UInt64Array>()
        .unwrap();
    assert_eq!(column.len(), 1, "{cache}.{metric}");
    column.value(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lakecache_stats_reports_the_figures_as_they_change() {
    let lake = LakeCache::builder().build().unwrap();
    let (_b, ctx) = after_a_lookup(&lake).await;
    let (hits, blooms) = (
        figure(&ctx, "index", "hits").await,
        figure(&ctx, "index", "bloom_loads").await,
    );
    assert!(blooms > 0, "the first lookup loads bloom filters");
    ctx.sql(LOOKUP).await.unwrap().collect().await.unwrap();
    assert!(
        figure(&ctx, "index", "hits").await > hits,
        "the second lookup hits"
    );
    assert_eq!(
        figure(&ctx, "index", "bloom_loads").await,
        blooms,
        "and loads nothing"
    );
    assert_eq!(
        figure(&ctx, "index", "entries").await,
        lake.stats().index.footers.entries
    );
    // One session: DataFusion's own list-files cache answers after the first listing.
    assert_eq!(figure(&ctx, "handle.listings", "misses").await, 1);
    let err = ctx
        .sql("SELECT * FROM lakecache_stats(1)")
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("lakecache_stats() takes no arguments"),
        "{err}"
    );
}

/// `lakecache_stats()` as (cache -> [entries, bytes, capacity, hits, misses, evictions,
/// expirations, invalidations]), NULL as `None`.
async fn per_cache(ctx: &SessionContext) -> std::collections::HashMap<String, Vec<Option<u64>>> {
    use datafusion::arrow::array::{Array, StringArray};
    let batches = ctx
        .sql("SELECT * FROM lakecache_stats()")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let mut rows = std::collections::HashMap::new();
    for batch in batches {
        let names = batch
            .column(0)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        for row in 0..batch.num_rows() {
            let values = (1..batch.num_columns())
                .map(|c| {
                    let column = batch
                        .column(c)
                        .as_any()
                        .downcast_ref::<UInt64Array>()
                        .unwrap();
                    (!column.is_null(row)).then(|| column.value(row))
                })
                .collect();
            rows.insert(names.value(row).to_string(), values);
        }
    }
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_per_cache_changes_across_two_queries_and_clear_empties_them() {
    const ENTRIES: usize = 0;
    const BYTES: usize = 1;
    const CAPACITY: usize = 2;
    const HITS: usize = 3;
    const MISSES: usize = 4;
    let lake = LakeCache::builder()
        .index_capacity_bytes(64 << 20)
        .sql_clear(true)
        .build()
        .unwrap();
    let (_b, ctx) = after_a_lookup(&lake).await;
    let first = per_cache(&ctx).await;
    for cache in [
        "handle.metadata",
        "handle.listings",
        "handle.files",
        "index",
        "index.bloom",
        "range.memory",
        "range.disk",
        "prefetch",
    ] {
        assert!(first.contains_key(cache), "{cache}: {first:?}");
    }
    // The lookup loaded each row group's filter for `name` (3 files x 5 row groups), the
    // prefetcher ahead of the readers, which looked each up once (a miss where they came
    // first).
    let bloom = &first["index.bloom"];
    let looked_up = bloom[HITS].zip(bloom[MISSES]).map(|(h, m)| h + m);
    assert_eq!(
        (bloom[ENTRIES], looked_up),
        (Some(15), Some(15)),
        "{bloom:?}"
    );
    let index = &first["index"];
    assert_eq!(index[CAPACITY], Some(64 << 20));
    assert!(
        index[ENTRIES] > Some(0) && index[BYTES] > Some(0),
        "{index:?}"
    );
    assert!(first["prefetch"][HITS].is_none(), "no hits for prefetching");

    ctx.sql(LOOKUP).await.unwrap().collect().await.unwrap();
    let second = per_cache(&ctx).await;
    assert!(second["index"][HITS] > index[HITS], "the second query hits");
    assert_eq!(second["index"][MISSES], index[MISSES], "and misses nothing");
    let hits = second["index.bloom"][HITS]
        .zip(bloom[HITS])
        .map(|(s, f)| s - f);
    assert_eq!(
        hits,
        Some(15),
        "the bloom filters hit: {:?}",
        second["index.bloom"]
    );

    let handles = lake.stats().handle.metadata.entries;
    let cleared = ctx
        .sql("SELECT * FROM lakecache_clear('index')")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let caches = cleared[0]
        .column(0)
        .as_any()
        .downcast_ref::<arrow::array::StringArray>()
        .unwrap();
    assert_eq!(
        caches.iter().flatten().collect::<Vec<_>>(),
        ["index", "index.bloom"]
    );
    let dropped = cleared[0]
        .column(1)
        .as_any()
        .downcast_ref::<UInt64Array>()
        .unwrap()
        .value(0);
    assert_eq!(Some(dropped), second["index"][ENTRIES]);
    assert_eq!(lake.stats().index.footers.entries, 0, "emptied");
    assert_eq!(per_cache(&ctx).await["index"][ENTRIES], Some(0));
    assert_eq!(
        lake.stats().handle.metadata.entries,
        handles,
        "the other caches kept"
    );
    let err = ctx
        .sql("SELECT * FROM lakecache_clear('all of it')")
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("'handle', 'index', 'range'"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lakecache_clear_is_off_unless_asked_for_and_clears_when_run() {
    let lake = LakeCache::builder().sql_clear(true).build().unwrap();
    let (_b, ctx) = after_a_lookup(&lake).await;
    let held = lake.stats().index.footers.entries;
    assert!(held > 0);
    ctx.sql("EXPLAIN SELECT * FROM lakecache_clear()")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(
        lake.stats().index.footers.entries,
        held,
        "explaining clears nothing"
    );
    let planned = ctx.sql("SELECT * FROM lakecache_clear()").await.unwrap();
    assert_eq!(
        lake.stats().index.footers.entries,
        held,
        "nor does planning"
    );
    planned.collect().await.unwrap();
    assert_eq!(lake.stats().index.footers.entries, 0, "running does");

    // Off by default: no session of a shared LakeCache empties every tenant's caches.
    let closed = LakeCache::builder().build().unwrap();
    let (_b, ctx) = after_a_lookup(&closed).await;
    let err = ctx
        .sql("SELECT * FROM lakecache_clear()")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("lakecache_clear"), "{err}");
    assert!(closed.stats().index.footers.entries > 0);
}

/// The rows of `sql` in `ctx`, each as its columns' text.
async fn table_rows(ctx: &SessionContext, sql: &str) -> Vec<Vec<String>> {
    let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
    let mut rows = Vec::new();
    for batch in &batches {
        for row in 0..batch.num_rows() {
            rows.push(
                batch
                    .columns()
                    .iter()
                    .map(|c| {
                        datafusion::arrow::util::display::array_value_to_string(c, row).unwrap()
                    })
                    .collect(),
            );
        }
    }
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_fills_the_caches_entries_show_them_and_invalidate_drops_one_object() {
    let lake = LakeCache::builder().sql_manage(true).build().unwrap();
    let b = common::memory_backend();
    b.write(&LakeSpec::small_files(4)).await;
    let counted = b.counting();
    let ctx = common::installed(
        &b,
        counted.clone(),
        &lake,
        SessionStateBuilder::new(),
        datafusion::prelude::SessionConfig::new(),
    )
    .await;
    const QUERY: &str = "SELECT category, round(sum(value), 3) FROM t GROUP BY category";
    let expected = common::rows(&ctx, QUERY).await.unwrap();
    lake.clear();

    // Planned or explained, it reads nothing; run, it reads the table once.
    counted.reset();
    let prefetched = lake.stats().prefetch.requests;
    ctx.sql("EXPLAIN SELECT * FROM lakecache_warm('t')")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    // Planning reads the footers the clear dropped (one GET per file), no data.
    assert!(counted.counts().get <= 4, "{:?}", counted.counts());
    assert_eq!(
        lake.stats().prefetch.requests,
        prefetched,
        "explaining warms nothing"
    );
    let warmed = table_rows(&ctx, "SELECT * FROM lakecache_warm('t', 'category, value')").await;
    assert_eq!(warmed.len(), 1);
    assert_eq!(
        (warmed[0][0].as_str(), warmed[0][1].as_str()),
        ("t", "20000")
    );
    assert!(counted.counts().get > 0);

    // The first query after it makes no request.
    counted.reset();
    assert_eq!(common::rows(&ctx, QUERY).await.unwrap(), expected);
    assert_eq!(counted.counts().get, 0, "{:?}", counted.counts());

    // A row per object version this session's store has shown, with what is cached of it.
    let entries = table_rows(
        &ctx,
        "SELECT object, memory_bytes, footer_bytes FROM lakecache_entries() ORDER BY object",
    )
    .await;
    assert_eq!(entries.len(), 4, "{entries:?}");
    for row in &entries {
        assert!(row[0].starts_with("memory:///lake/"), "{row:?}");
        assert!(row[1] != "0" && row[2] != "0", "{row:?}");
    }
    // A session whose store has shown nothing sees no entry.
    let other = session(&LakeCache::clone(&lake));
    other.register_object_store(&b.store_url, b.counting());
    assert!(
        table_rows(&other, "SELECT * FROM lakecache_entries()")
            .await
            .is_empty()
    );

    // Invalidating one object drops it alone; the next query reads it again, and only it.
    let first = entries[0][0].clone();
    let dropped = table_rows(
        &ctx,
        &format!("SELECT * FROM lakecache_invalidate('{first}')"),
    )
    .await;
    assert_eq!(dropped.len(), 1, "{dropped:?}");
    assert_eq!(
        (dropped[0][0].as_str(), dropped[0][2].as_str()),
        (first.as_str(), "true")
    );
    let left = table_rows(
        &ctx,
        "SELECT object FROM lakecache_entries() ORDER BY object",
    )
    .await;
    assert_eq!(left.len(), 3);
    assert!(!left.iter().any(|r| r[0] == first));
    counted.reset();
    assert_eq!(common::rows(&ctx, QUERY).await.unwrap(), expected);
    let again = counted.counts();
    assert!(again.get >= 1 && again.get <= 3, "{again:?}");

    // Bad calls name the function and how to call it.
    for (sql, expected) in [
        ("SELECT * FROM lakecache_warm('nope')", "no table 'nope'"),
        (
            "SELECT * FROM lakecache_warm('t', 'nope')",
            "has not every column",
        ),
        (
            "SELECT * FROM lakecache_invalidate('not a url')",
            "is not a URL",
        ),
        ("SELECT * FROM lakecache_entries('t')", "takes no argument"),
    ] {
        let err = match ctx.sql(sql).await {
            Ok(frame) => frame.collect().await.unwrap_err(),
            Err(e) => e,
        };
        assert!(err.to_string().contains(expected), "{sql}: {err}");
    }

    // Off by default, as they act on caches every session shares.
    let closed = session(&LakeCache::builder().build().unwrap());
    for name in [
        "lakecache_warm('t')",
        "lakecache_entries()",
        "lakecache_invalidate('memory:///x')",
    ] {
        let err = closed
            .sql(&format!("SELECT * FROM {name}"))
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains(name.split('(').next().unwrap()),
            "{err}"
        );
    }
}
