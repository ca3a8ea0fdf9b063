//! A `StandaloneTable` in a host session that has none of the caches: no store for the
//! lake's URL, DataFusion's default runtime (as a table handed across datafusion-ffi is
//! scanned). Its scans plan and run in its own installed session, with every capability.

mod common;

use std::sync::Arc;

use common::{backends, rows};
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::object_store::{DefaultObjectStoreRegistry, ObjectStoreRegistry};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use datafusion_lakecache::testkit::corpus::CORPUS;
use datafusion_lakecache::testkit::lake::LakeSpec;
use datafusion_lakecache::{LakeCache, LakeTable, StandaloneTable};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_without_the_store_gets_vanilla_rows_and_repeats_make_no_request() {
    for b in backends("standalone") {
        b.write(&LakeSpec::small_files(8)).await;
        let plain = SessionContext::new();
        plain.register_object_store(&b.store_url, b.raw.clone());
        plain
            .register_parquet("t", b.table_url(), ParquetReadOptions::default())
            .await
            .unwrap();
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
        let table = StandaloneTable::new(Arc::new(table), own, &lake);
        // The host knows nothing of the lake's store.
        let host = SessionContext::new();
        host.register_table("t", Arc::new(table)).unwrap();
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
