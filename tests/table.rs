//! LakeTable through DataFusion, end to end: the same rows and the same pruning as
//! DataFusion's own ListingTable, with footers, page indexes and bloom filters read once.

mod common;

use std::sync::Arc;

use std::collections::HashMap;

use common::{Backend, backends, installed, local_backend, rows, scan_metric};
use datafusion::arrow::datatypes::DataType;
use datafusion::datasource::file_format::options::ReadOptions;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use datafusion_lakecache::testkit::corpus::CORPUS;
use datafusion_lakecache::testkit::lake::LakeSpec;
use datafusion_lakecache::testkit::lake::{file_bytes, write_lake};
use datafusion_lakecache::testkit::requests::count_reads;
use datafusion_lakecache::{LakeCache, LakeTable};
use object_store::ObjectStore;
use object_store::ObjectStoreExt;
use object_store::path::Path;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader};

fn config(pushdown: bool) -> SessionConfig {
    let mut config = SessionConfig::new().with_target_partitions(2);
    config.options_mut().execution.parquet.pushdown_filters = pushdown;
    config
}

async fn vanilla(b: &Backend, store: Arc<dyn ObjectStore>, pushdown: bool) -> SessionContext {
    let ctx = SessionContext::new_with_config(config(pushdown));
    ctx.register_object_store(&b.store_url, store);
    ctx.register_parquet("t", b.table_url(), ParquetReadOptions::default())
        .await
        .unwrap();
    ctx
}

async fn lake_ctx(
    b: &Backend,
    store: Arc<dyn ObjectStore>,
    lake: &LakeCache,
    pushdown: bool,
) -> SessionContext {
    let ctx = SessionContext::new_with_config(config(pushdown));
    ctx.register_object_store(&b.store_url, store);
    let table = LakeTable::try_new(&ctx.state(), &b.table_url(), lake)
        .await
        .unwrap();
    ctx.register_table("t", Arc::new(table)).unwrap();
    ctx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_corpus_returns_vanillas_rows() {
    // A local directory (descriptors, no range cache), a remote-like store (range cache) and
    // the S3 server.
    let mut all = backends("corpus");
    all.push(common::memory_backend());
    for b in all {
        corpus_on(&b).await;
    }
}

async fn corpus_on(b: &Backend) {
    b.write(&LakeSpec::small_files(8).with_row_groups_of(1_000))
        .await;
    let lake = LakeCache::builder().build().unwrap();
    // Prefetching small files whole, and large files chunk by chunk in 64 KiB pieces (local
    // files too, which are not prefetched by default).
    let whole = LakeCache::builder()
        .prefetch_local_files(true)
        .build()
        .unwrap();
    let chunks = LakeCache::builder()
        .prefetch_local_files(true)
        .set("lakecache.prefetch.small_file", "1KiB")
        .set("lakecache.prefetch.split_size", "64KiB")
        .build()
        .unwrap();
    let name = b.name;
    for pushdown in [false, true] {
        let plain = vanilla(b, b.raw.clone(), pushdown).await;
        let cached = lake_ctx(b, b.raw.clone(), &lake, pushdown).await;
        let new = SessionStateBuilder::new;
        let whole = installed(b, b.raw.clone(), &whole, new(), config(pushdown)).await;
        let chunks = installed(b, b.raw.clone(), &chunks, new(), config(pushdown)).await;
        for sql in CORPUS {
            let want = rows(&plain, sql).await.unwrap();
            for run in 0..2 {
                for (side, ctx) in [
                    ("LakeTable", &cached),
                    ("whole", &whole),
                    ("chunks", &chunks),
                ] {
                    let got = rows(ctx, sql).await.unwrap();
                    assert_eq!(
                        got, want,
                        "{name} {side} pushdown={pushdown} run {run}: {sql}"
                    );
                }
            }
        }
    }
    for (side, lake) in [("whole", &whole), ("chunks", &chunks)] {
        let p = lake.stats().prefetch;
        assert!(p.failed == 0, "{name} {side}: {p:?}");
        // Remote files were read whole while planning, and kept: nothing is left to prefetch.
        if name == "local" {
            assert!(p.bytes_used > 0, "{name} {side}: {p:?}");
        }
    }
    let stats = lake.stats().index;
    assert_eq!(
        stats.footer_loads, 8,
        "{name}: one footer load per file: {stats:?}"
    );
    assert!(stats.bloom_loads > 0, "{name}: {stats:?}");
}

/// Metadata and size of every file of the lake, decoded from the generator's bytes.
fn file_index(b: &Backend, spec: &LakeSpec) -> HashMap<Path, (Arc<ParquetMetaData>, u64)> {
    (0..spec.files)
        .map(|i| {
            let bytes = file_bytes(spec, i).unwrap();
            let metadata = ParquetMetaDataReader::new()
                .with_page_index_policy(PageIndexPolicy::Optional)
                .parse_and_finish(&bytes)
                .unwrap();
            let path = b.prefix.clone().join(LakeSpec::file_name(i));
            (path, (Arc::new(metadata), bytes.len() as u64))
        })
        .collect()
}

/// Point lookups on columns with bloom filters and a page index.
const LOOKUPS: &[&str] = &[
    "SELECT * FROM t WHERE id = 4242",
    "SELECT id, value FROM t WHERE name = 'name-012345'",
    "SELECT id FROM t WHERE id IN (17, 23456)",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_queries_read_no_metadata_and_decode_nothing() {
    for b in backends("warm_metadata") {
        let spec = LakeSpec::small_files(6).with_row_groups_of(1_000);
        b.write(&spec).await;
        let files = file_index(&b, &spec);
        let lake = LakeCache::builder().build().unwrap();
        let (plain_counts, lake_counts) = (b.counting(), b.counting());
        let plain = vanilla(&b, plain_counts.clone(), false).await;
        let runtime = RuntimeEnvBuilder::new()
            .with_cache_manager(lake.cache_manager_config())
            .build_arc()
            .unwrap();
        let cached = SessionContext::new_with_config_rt(config(false), runtime);
        cached.register_object_store(&b.store_url, lake_counts.clone());
        let table = LakeTable::try_new(&cached.state(), &b.table_url(), &lake)
            .await
            .unwrap();
        cached.register_table("t", Arc::new(table)).unwrap();

        for sql in LOOKUPS {
            assert_eq!(
                rows(&cached, sql).await.unwrap(),
                rows(&plain, sql).await.unwrap(),
                "{sql}"
            );
        }
        let loads = lake.stats().index;
        for sql in LOOKUPS {
            plain_counts.reset();
            lake_counts.reset();
            let want = rows(&plain, sql).await.unwrap();
            assert_eq!(rows(&cached, sql).await.unwrap(), want, "{sql}");
            let vanilla = count_reads(&plain_counts.gets(), &files);
            let ours = count_reads(&lake_counts.gets(), &files);
            eprintln!(
                "{} warm `{sql}`: vanilla {vanilla:?}, lakecache {ours:?}",
                b.name
            );
            assert_eq!(
                ours.metadata(),
                0,
                "{}: warm LakeTable reads no metadata: {ours:?}",
                b.name
            );
            assert!(
                vanilla.bloom_filter > 0,
                "{}: vanilla re-reads bloom filters: {vanilla:?}",
                b.name
            );
            assert_eq!(ours.data, vanilla.data, "{}: the same data reads", b.name);
        }
        let after = lake.stats().index;
        assert_eq!(
            after.footer_loads, loads.footer_loads,
            "no footer decoded when warm"
        );
        assert_eq!(
            after.bloom_loads, loads.bloom_loads,
            "no bloom filter loaded when warm"
        );
    }
}

/// The pruning figures of a query's `EXPLAIN ANALYZE`, as text, in plan order.
async fn pruning_figures(ctx: &SessionContext, sql: &str) -> Vec<String> {
    let names = [
        "row_groups_pruned_statistics",
        "row_groups_pruned_bloom_filter",
        "page_index_rows_pruned",
        "page_index_pages_pruned",
    ];
    let text = rows(ctx, &format!("EXPLAIN ANALYZE {sql}"))
        .await
        .unwrap()
        .join("\n");
    let mut figures = Vec::new();
    for name in names {
        for (at, _) in text.match_indices(&format!("{name}=")) {
            let value: String = text[at..]
                .chars()
                .take_while(|&c| c != ',' && c != ']')
                .collect();
            figures.push(value);
        }
    }
    figures
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_analyze_shows_vanillas_pruning() {
    let b = local_backend();
    b.write(&LakeSpec::small_files(6).with_row_groups_of(1_000))
        .await;
    let lake = LakeCache::builder().build().unwrap();
    for pushdown in [false, true] {
        let plain = vanilla(&b, b.raw.clone(), pushdown).await;
        let cached = lake_ctx(&b, b.raw.clone(), &lake, pushdown).await;
        // Dynamic filters (TopK, joins) prune by timing, differently from run to run even on
        // vanilla; the comparison is of the static pruning.
        for ctx in [&plain, &cached] {
            ctx.sql("SET datafusion.optimizer.enable_dynamic_filter_pushdown = false")
                .await
                .unwrap();
        }
        for sql in CORPUS.iter().chain(LOOKUPS) {
            let want = pruning_figures(&plain, sql).await;
            for _ in 0..2 {
                assert_eq!(
                    pruning_figures(&cached, sql).await,
                    want,
                    "pushdown={pushdown}: {sql}"
                );
            }
        }
    }
    let figures =
        pruning_figures(&lake_ctx(&b, b.raw.clone(), &lake, false).await, LOOKUPS[1]).await;
    assert!(
        figures
            .iter()
            .any(|f| f.starts_with("row_groups_pruned_bloom_filter=") && !f.contains("=0 ")),
        "{figures:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_external_table_gives_a_lake_table() {
    let b = local_backend();
    b.write(&LakeSpec::small_files(3)).await;
    let lake = LakeCache::builder().build().unwrap();
    let state = datafusion::execution::SessionStateBuilder::new()
        .with_default_features()
        .with_table_factory(
            "PARQUET".into(),
            Arc::new(datafusion_lakecache::LakeTableFactory::new(&lake)),
        )
        .build();
    let ctx = SessionContext::new_with_state(state);
    ctx.sql(&format!(
        "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION '{}'",
        b.table_url()
    ))
    .await
    .unwrap();
    let provider = ctx.table_provider("t").await.unwrap();
    assert!(provider.downcast_ref::<LakeTable>().is_some());
    let got = rows(&ctx, "SELECT count(*), sum(id) FROM t").await.unwrap();
    let want = rows(
        &vanilla(&b, b.raw.clone(), false).await,
        "SELECT count(*), sum(id) FROM t",
    )
    .await
    .unwrap();
    assert_eq!(got, want);
    assert_eq!(lake.stats().index.footer_loads, 3);
}

#[test]
fn the_corpus_has_at_least_forty_queries() {
    assert!(CORPUS.len() >= 40, "{}", CORPUS.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hive_partitioned_directory_returns_vanillas_rows() {
    for b in backends("hive") {
        for (i, region) in ["eu", "us", "ap"].into_iter().enumerate() {
            let spec = LakeSpec::small_files(2)
                .with_row_groups_of(1_000)
                .with_seed(i as u64);
            write_lake(
                b.raw.as_ref(),
                &b.prefix.clone().join(format!("region={region}")),
                &spec,
            )
            .await
            .unwrap();
        }
        let lake = LakeCache::builder().build().unwrap();
        let read = ParquetReadOptions::default()
            .table_partition_cols(vec![("region".into(), DataType::Utf8)]);
        let plain = SessionContext::new_with_config(config(true));
        plain.register_object_store(&b.store_url, b.raw.clone());
        plain
            .register_parquet("t", b.table_url(), read.clone())
            .await
            .unwrap();
        let cached = SessionContext::new_with_config(config(true));
        cached.register_object_store(&b.store_url, b.raw.clone());
        let options =
            read.to_listing_options(&cached.copied_config(), cached.copied_table_options());
        let table =
            LakeTable::try_new_with_options(&cached.state(), &b.table_url(), options, &lake)
                .await
                .unwrap();
        cached.register_table("t", Arc::new(table)).unwrap();
        for sql in [
            "SELECT region, count(*), sum(id) FROM t GROUP BY region",
            "SELECT id, name FROM t WHERE region = 'us' AND id = 4242",
            "SELECT region, id FROM t WHERE name = 'name-012345'",
            "SELECT count(*) FROM t WHERE region IN ('eu', 'ap') AND note IS NULL",
            "SELECT a.region, b.region, count(*) FROM t a JOIN t b ON a.id = b.id AND a.region <> b.region WHERE a.id < 50 GROUP BY 1, 2",
        ] {
            let want = rows(&plain, sql).await.unwrap();
            for _ in 0..2 {
                assert_eq!(rows(&cached, sql).await.unwrap(), want, "{}: {sql}", b.name);
            }
        }
        assert_eq!(lake.stats().index.footer_loads, 6);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_added_to_the_directory_shows_up_after_the_listing_ttl() {
    let b = local_backend();
    let spec = LakeSpec::small_files(3);
    b.write(&spec).await;
    let lake = LakeCache::builder()
        .list_ttl(std::time::Duration::from_millis(200))
        .build()
        .unwrap();
    let runtime = RuntimeEnvBuilder::new()
        .with_cache_manager(lake.cache_manager_config())
        .build_arc()
        .unwrap();
    let ctx = SessionContext::new_with_config_rt(config(false), runtime);
    ctx.register_object_store(&b.store_url, b.raw.clone());
    let table = LakeTable::try_new(&ctx.state(), &b.table_url(), &lake)
        .await
        .unwrap();
    ctx.register_table("t", Arc::new(table)).unwrap();
    let count = "SELECT count(*) FROM t";
    assert!(
        rows(&ctx, count)
            .await
            .unwrap()
            .iter()
            .any(|l| l.contains("15000"))
    );
    let more = LakeSpec { files: 4, ..spec };
    let path = b.prefix.clone().join(LakeSpec::file_name(3));
    b.raw
        .put(&path, file_bytes(&more, 3).unwrap().into())
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let after = rows(&ctx, count).await.unwrap();
    assert!(
        after.iter().any(|l| l.contains("20000")),
        "the new file is listed: {after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_listing_tables_footers_stay_in_its_runtime_not_the_shared_cache() {
    let b = local_backend();
    b.write(&LakeSpec::small_files(3)).await;
    let lake = LakeCache::builder().build().unwrap();
    let runtime = RuntimeEnvBuilder::new()
        .with_cache_manager(lake.cache_manager_config())
        .build_arc()
        .unwrap();
    let ctx = SessionContext::new_with_config_rt(config(false), runtime);
    ctx.register_object_store(&b.store_url, b.raw.clone());
    ctx.register_parquet("t", b.table_url(), ParquetReadOptions::default())
        .await
        .unwrap();
    let provider = ctx.table_provider("t").await.unwrap();
    assert!(
        provider.downcast_ref::<LakeTable>().is_none(),
        "a plain ListingTable"
    );
    rows(&ctx, "SELECT count(*) FROM t WHERE id = 7")
        .await
        .unwrap();
    // DataFusion keys its footers by path alone, with no store to prove access with: they
    // are this runtime's, as in plain DataFusion, never shared through the `LakeCache`.
    let footers = ctx.runtime_env().cache_manager.get_file_metadata_cache();
    assert_eq!(footers.len(), 3, "DataFusion's footers are cached");
    let stats = lake.stats().index;
    assert_eq!(stats.footers.entries, 0, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clear_and_invalidate_make_the_next_query_load_again() {
    let b = local_backend();
    let paths = b.write(&LakeSpec::small_files(3)).await;
    let lake = LakeCache::builder().build().unwrap();
    let ctx = lake_ctx(&b, b.raw.clone(), &lake, false).await;
    let sql = "SELECT count(*) FROM t WHERE id = 7";
    let want = rows(&ctx, sql).await.unwrap();
    let loads = lake.stats().index.footer_loads;
    assert_eq!(rows(&ctx, sql).await.unwrap(), want);
    assert_eq!(
        lake.stats().index.footer_loads,
        loads,
        "warm: nothing loaded"
    );

    lake.invalidate(&b.store_url, &paths[0]);
    assert_eq!(rows(&ctx, sql).await.unwrap(), want);
    assert_eq!(
        lake.stats().index.footer_loads,
        loads + 1,
        "the invalidated file is loaded again"
    );

    lake.clear();
    assert_eq!(lake.stats().index.footers.entries, 0);
    assert_eq!(rows(&ctx, sql).await.unwrap(), want);
    assert_eq!(
        lake.stats().index.footer_loads,
        loads + 2,
        "the one file the query opens is loaded again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_analyze_keeps_datafusions_own_scan_metrics() {
    for b in backends("scan_metrics") {
        b.write(&LakeSpec::small_files(4).with_row_groups_of(1_000))
            .await;
        let lake = LakeCache::builder().build().unwrap();
        let plain = vanilla(&b, b.raw.clone(), false).await;
        let cached = installed(
            &b,
            b.raw.clone(),
            &lake,
            SessionStateBuilder::new(),
            config(false),
        )
        .await;
        for sql in [
            "SELECT count(*), sum(id) FROM t",
            "SELECT id, value FROM t WHERE id BETWEEN 1200 AND 1260",
            "SELECT * FROM t WHERE name = 'name-012345'",
            "SELECT name FROM t WHERE id % 1000 = 7 ORDER BY name LIMIT 5",
        ] {
            let explain = format!("EXPLAIN ANALYZE {sql}");
            let want = rows(&plain, &explain).await.unwrap();
            // Twice: cold, then with every cache warm.
            for run in 0..2 {
                let got = rows(&cached, &explain).await.unwrap();
                for metric in ["bytes_scanned", "scan_efficiency_ratio", "output_rows"] {
                    let (w, g) = (scan_metric(&want, metric), scan_metric(&got, metric));
                    assert!(!w.is_empty(), "{}: {metric} in {want:?}", b.name);
                    assert_eq!(g, w, "{} run {run}: {metric} of `{sql}`", b.name);
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_the_predicate_rules_out_by_their_statistics_never_reach_the_opener() {
    for b in backends("file_pruning") {
        // 12 files of 5,000 rows: ids 0..60,000, one file's range each.
        b.write(&LakeSpec::small_files(12)).await;
        let lake = LakeCache::builder().build().unwrap();
        let plain = vanilla(&b, b.raw.clone(), false).await;
        let cached = installed(
            &b,
            b.raw.clone(),
            &lake,
            SessionStateBuilder::new(),
            config(false),
        )
        .await;
        let opened = |explain: &[String]| -> usize {
            // `files_ranges_pruned_statistics=N total → M matched`: the files the opener saw.
            scan_metric(explain, "files_ranges_pruned_statistics")
                .iter()
                .map(|f| f.split(' ').next().unwrap().parse::<usize>().unwrap())
                .sum()
        };
        for (sql, files) in [
            ("SELECT id, name FROM t WHERE id = 42424", 1),
            (
                "SELECT count(*), round(sum(value), 3) FROM t WHERE id BETWEEN 9000 AND 10500",
                2,
            ),
            ("SELECT count(*) FROM t WHERE id > 1000000", 0),
            // No statistics can rule a file out: every file is opened.
            ("SELECT count(*) FROM t WHERE id % 7 = 3", 12),
        ] {
            let want = rows(&plain, sql).await.unwrap();
            assert_eq!(rows(&cached, sql).await.unwrap(), want, "{}: {sql}", b.name);
            let explain = format!("EXPLAIN ANALYZE {sql}");
            let vanilla_opened = opened(&rows(&plain, &explain).await.unwrap());
            assert_eq!(
                vanilla_opened, 12,
                "{}: DataFusion opens every file",
                b.name
            );
            let got = rows(&cached, &explain).await.unwrap();
            assert_eq!(opened(&got), files, "{}: `{sql}`: {got:?}", b.name);
        }
    }
}
