//! A `StandaloneTable` in a host session that has none of the caches: no store for the
//! lake's URL, DataFusion's default runtime (as a table handed across datafusion-ffi is
//! scanned). Its scans plan and run in its own installed session, with every capability.

mod common;

use std::sync::Arc;

use common::rows;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::object_store::{DefaultObjectStoreRegistry, ObjectStoreRegistry};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use datafusion_lakecache::testkit::corpus::CORPUS;
use datafusion_lakecache::testkit::lake::LakeSpec;
use datafusion_lakecache::{LakeCache, LakeTable, StandaloneTable};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_without_the_store_gets_vanilla_rows_and_repeats_make_no_request() {
    // Local files (read in place, through descriptors: no GET is asked of them), the
    // in-memory store and, when configured, the S3 server (no GET when warm).
    let local = std::iter::once(common::local_backend());
    for b in local.chain(common::remote_backends("standalone")) {
        b.write(&LakeSpec::small_files(8)).await;
        let plain = SessionContext::new();
        plain.register_object_store(&b.store_url, b.raw.clone());
        plain
            .register_parquet("t", b.table_url(), ParquetReadOptions::default())
            .await
            .unwrap();
        // The host knows nothing of the lake's store.
        let (host, counted, lake) = cold_session(&b, true).await;
        for sql in CORPUS {
            assert_eq!(
                rows(&host, sql).await.unwrap(),
                rows(&plain, sql).await.unwrap(),
                "{}: {sql}",
                b.name
            );
        }
        let stats = lake.stats();
        assert!(
            stats.prefetch.scans > 0,
            "{}: scans prefetched: {stats:?}",
            b.name
        );
        counted.reset();
        for sql in CORPUS {
            rows(&host, sql).await.unwrap();
        }
        if b.name != "local" {
            assert_eq!(counted.counts().get, 0, "{}: warm, no GET", b.name);
        }
        assert_eq!(counted.counts().head, 0, "{}: warm, no HEAD", b.name);
    }
}

/// A new `LakeCache`'s table over `b`'s lake, as a standalone table in a host with nothing
/// of the caches (`standalone`), or in an installed session; and its counted store.
async fn cold_session(
    b: &common::Backend,
    standalone: bool,
) -> (SessionContext, Arc<common::Counted>, LakeCache) {
    // The table's own session: its store, counted, wrapped by the caches.
    let lake = LakeCache::builder().build().unwrap();
    let counted = b.counting();
    let stores = DefaultObjectStoreRegistry::new();
    stores.register_store(&b.store_url, counted.clone());
    let runtime = RuntimeEnvBuilder::new()
        .with_object_store_registry(Arc::new(stores))
        .build_arc()
        .unwrap();
    let own = lake
        .install(
            SessionStateBuilder::new()
                .with_default_features()
                .with_runtime_env(runtime),
        )
        .unwrap()
        .build();
    let table = LakeTable::try_new(&own, &b.table_url(), &lake)
        .await
        .unwrap();
    if !standalone {
        let ctx = SessionContext::new_with_state(own);
        ctx.register_table("t", Arc::new(table)).unwrap();
        return (ctx, counted, lake);
    }
    let host = SessionContext::new();
    let table = StandaloneTable::new(Arc::new(table), own, &lake);
    host.register_table("t", Arc::new(table)).unwrap();
    (host, counted, lake)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hosts_filters_prune_files_and_row_groups_as_in_an_installed_session() {
    // The host's optimizer cannot push a filter below the table's scan: the table pushes
    // the filters it is handed into its Parquet readers itself. A filter only one file's
    // statistics admit reads that file's data alone, as an installed session does.
    for b in common::remote_backends("standalone-pruning") {
        b.write(&LakeSpec::small_files(8)).await;
        let sql = "SELECT count(*), round(sum(value), 3) FROM t WHERE id BETWEEN 5000 AND 9999";
        let mut counts = Vec::new();
        for standalone in [false, true] {
            let (ctx, counted, _) = cold_session(&b, standalone).await;
            counted.reset();
            let got = rows(&ctx, sql).await.unwrap();
            counts.push((got, counted.counts().get));
        }
        eprintln!(
            "{}: installed {:?}, standalone {:?}",
            b.name, counts[0], counts[1]
        );
        assert_eq!(counts[1].0, counts[0].0, "{}: rows", b.name);
        assert!(
            counts[0].1 <= 2,
            "{}: installed, one file's data: {counts:?}",
            b.name
        );
        assert_eq!(counts[1].1, counts[0].1, "{}: GETs as installed", b.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_the_table_applies_exactly_needs_no_column_the_host_left_out() {
    // A filter on a partition column is exact for the listing table: the host drops it and,
    // with it, the column from the scan's projection. The table's own filter is made of the
    // other filters alone.
    use datafusion::arrow::datatypes::DataType;
    use datafusion::datasource::file_format::parquet::ParquetFormat;
    use datafusion::datasource::listing::ListingOptions;
    use datafusion_lakecache::testkit::lake::write_lake;
    let b = common::local_backend();
    for part in ["1", "2"] {
        let prefix = b.prefix.clone().join(format!("k={part}"));
        write_lake(b.raw.as_ref(), &prefix, &LakeSpec::small_files(2))
            .await
            .unwrap();
    }
    let lake = LakeCache::builder().build().unwrap();
    let own = lake
        .install(SessionStateBuilder::new().with_default_features())
        .unwrap()
        .build();
    let options = ListingOptions::new(Arc::new(ParquetFormat::default()))
        .with_file_extension(".parquet")
        .with_table_partition_cols(vec![("k".to_string(), DataType::Utf8)]);
    let table = LakeTable::try_new_with_options(&own, &b.table_url(), options, &lake)
        .await
        .unwrap();
    let host = SessionContext::new();
    host.register_table(
        "t",
        Arc::new(StandaloneTable::new(Arc::new(table), own, &lake)),
    )
    .unwrap();
    for (sql, want) in [
        ("SELECT count(*) AS n FROM t WHERE k = '2'", "10000"),
        (
            "SELECT count(*) AS n FROM t WHERE k = '2' AND id < 100",
            "100",
        ),
    ] {
        let got = rows(&host, sql).await.unwrap();
        // The count's own cell, whole: "100" is not "10000".
        let cell = |line: &String| line.trim_matches(|c| c == '|' || c == ' ').to_string();
        assert!(got.iter().any(|line| cell(line) == want), "{sql}: {got:?}");
    }
}
