//! The handle cache through DataFusion, end to end, on a local directory and on the S3
//! server: each test runs SQL in fresh `SessionContext`s that share one `LakeCache`, the way
//! repeated queries of a long-running service share it.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Backend, WORKLOAD, backends, scan, scan_with};
use datafusion::prelude::SessionConfig;
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::testkit::lake::{LakeSpec, file_bytes};
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

fn lake() -> LakeCache {
    LakeCache::builder().build().unwrap()
}

async fn expected(backend: &Backend, sql: &str) -> Vec<String> {
    scan(backend, Arc::clone(&backend.raw), sql).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_through_the_cache_returns_the_lakes_rows_and_records_its_files() {
    for b in backends("basic_scan") {
        b.write(&LakeSpec::small_files(4)).await;
        let lake = lake();
        let store = b.cached(&b.counting(), &lake);
        let rows = scan(&b, store, "SELECT count(*), sum(id) FROM t")
            .await
            .unwrap();
        let n: i64 = 4 * 5_000;
        assert!(
            rows.iter().any(|l| l.contains(&format!("| {n} "))
                && l.contains(&format!("| {} ", n * (n - 1) / 2))),
            "{}: {rows:?}",
            b.name
        );
        let stats = lake.stats().handle;
        assert!(stats.metadata.entries >= 4, "{}: {stats:?}", b.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_scans_are_identical_and_make_no_head_or_list() {
    for b in backends("repeated_scans") {
        b.write(&LakeSpec::small_files(8)).await;
        let lake = lake();
        let counted = b.counting();
        let store = b.cached(&counted, &lake);
        for sql in WORKLOAD {
            let want = expected(&b, sql).await;
            for run in 0..10 {
                counted.reset();
                let got = scan(&b, store.clone(), sql).await.unwrap();
                assert_eq!(got, want, "{} run {run}: {sql}", b.name);
                let counts = counted.counts();
                if run > 0 || sql != WORKLOAD[0] {
                    assert_eq!(
                        (counts.head, counts.list),
                        (0, 0),
                        "{} run {run}: {counts:?}",
                        b.name
                    );
                }
            }
        }
        let stats = lake.stats().handle;
        assert!(stats.listings.hits >= 29, "{}: {stats:?}", b.name);
        if b.name == "local" {
            assert!(stats.files.hits > 0, "descriptors reused: {stats:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filtered_scan_with_pushdown_matches_the_plain_store() {
    for b in backends("filtered_pushdown") {
        b.write(&LakeSpec::small_files(6).with_row_groups_of(1_000))
            .await;
        let lake = lake();
        let store = b.cached(&b.counting(), &lake);
        for pushdown in [true, false] {
            let mut config = SessionConfig::new();
            config.options_mut().execution.parquet.pushdown_filters = pushdown;
            for sql in [
                "SELECT id, name FROM t WHERE id BETWEEN 12345 AND 12400",
                "SELECT id, ts FROM t WHERE name = 'name-001234' OR id = 29999",
                "SELECT count(*) FROM t WHERE note IS NULL AND value > 500",
                "SELECT id FROM t WHERE name LIKE 'name-0000%' AND category <> 'beta'",
            ] {
                let want = scan_with(&b, Arc::clone(&b.raw), sql, config.clone())
                    .await
                    .unwrap();
                for _ in 0..2 {
                    let got = scan_with(&b, store.clone(), sql, config.clone())
                        .await
                        .unwrap();
                    assert_eq!(got, want, "{} pushdown={pushdown}: {sql}", b.name);
                }
                assert!(want.len() > 4, "the filter keeps some rows: {sql}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_deleted_between_scans_is_not_found_or_absent() {
    for b in backends("deleted_file") {
        let spec = LakeSpec::small_files(5);
        let paths = b.write(&spec).await;
        let lake = lake();
        let store = b.cached(&b.counting(), &lake);
        let sql = "SELECT count(*), sum(id) FROM t";
        let with = scan(&b, store.clone(), sql).await.unwrap();

        // Deleted behind the cache's back: a not-found error naming the file, the rows of the
        // remaining files, or (every byte held, within the TTLs) the rows of the lake before.
        // Anything else fails.
        b.raw.delete(&paths[2]).await.unwrap();
        let without = expected(&b, sql).await;
        match scan(&b, store.clone(), sql).await {
            Ok(rows) => assert!(rows == without || rows == with, "{}: {rows:?}", b.name),
            Err(e) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("not found") && msg.contains(&LakeSpec::file_name(2)),
                    "{}: {msg}",
                    b.name
                );
            }
        }
        // Once the caches let it go, the file is gone: the next scan is right.
        lake.invalidate(&b.store_url, &paths[2]);
        assert_eq!(
            scan(&b, store.clone(), sql).await.unwrap(),
            without,
            "{}",
            b.name
        );

        // Deleted through the cache: the very next scan is right.
        store.delete(&paths[3]).await.unwrap();
        let without_two = expected(&b, sql).await;
        assert_ne!(without_two, without);
        assert_eq!(
            scan(&b, store.clone(), sql).await.unwrap(),
            without_two,
            "{}",
            b.name
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_replaced_in_place_gives_the_new_rows() {
    for b in backends("replaced_file") {
        let spec = LakeSpec::small_files(3);
        let paths = b.write(&spec).await;
        let lake = lake();
        let store = b.cached(&b.counting(), &lake);
        let sql = "SELECT count(*), min(name), round(sum(value), 3) FROM t";
        let before = scan(&b, store.clone(), sql).await.unwrap();

        // Replaced through the cache: the next scan sees the new rows.
        let other = spec.with_seed(7);
        store
            .put(&paths[1], PutPayload::from(file_bytes(&other, 1).unwrap()))
            .await
            .unwrap();
        let want = expected(&b, sql).await;
        assert_ne!(want, before);
        assert_eq!(
            scan(&b, store.clone(), sql).await.unwrap(),
            want,
            "{}",
            b.name
        );

        // Replaced behind the cache's back: the rows of the lake before (all of the file
        // held, within the TTLs) or after, or an error naming the file; once the caches let
        // the old version go, the new rows.
        let before = want;
        let third = spec.with_seed(9);
        b.raw
            .put(&paths[0], PutPayload::from(file_bytes(&third, 0).unwrap()))
            .await
            .unwrap();
        let want = expected(&b, sql).await;
        match scan(&b, store.clone(), sql).await {
            Ok(rows) => assert!(rows == want || rows == before, "{}: {rows:?}", b.name),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains(&LakeSpec::file_name(0)), "{}: {msg}", b.name);
            }
        }
        lake.invalidate(&b.store_url, &paths[0]);
        assert_eq!(
            scan(&b, store.clone(), sql).await.unwrap(),
            want,
            "{}",
            b.name
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_projections_over_cached_handles_return_the_plain_stores_rows() {
    for b in backends("projections") {
        b.write(&LakeSpec::small_files(4)).await;
        let lake = lake();
        let store = b.cached(&b.counting(), &lake);
        for sql in [
            "SELECT id FROM t WHERE id % 500 = 0",
            "SELECT name, category FROM t WHERE id % 500 = 0",
            "SELECT ts, note, value FROM t WHERE id % 500 = 0",
            "SELECT * FROM t WHERE id % 500 = 0",
            "SELECT value FROM t WHERE id % 500 = 0",
        ] {
            let want = expected(&b, sql).await;
            assert_eq!(
                scan(&b, store.clone(), sql).await.unwrap(),
                want,
                "{}: {sql}",
                b.name
            );
        }
        assert!(lake.stats().handle.listings.hits >= 4);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scans_stay_correct_after_entries_expire() {
    for b in backends("ttl_expiry") {
        b.write(&LakeSpec::small_files(3)).await;
        let lake = LakeCache::builder()
            .handle_ttl(Duration::from_millis(150))
            .list_ttl(Duration::from_millis(150))
            .build()
            .unwrap();
        let counted = b.counting();
        let store = b.cached(&counted, &lake);
        let sql = WORKLOAD[0];
        let want = expected(&b, sql).await;
        assert_eq!(scan(&b, store.clone(), sql).await.unwrap(), want);
        tokio::time::sleep(Duration::from_millis(300)).await;
        counted.reset();
        assert_eq!(
            scan(&b, store.clone(), sql).await.unwrap(),
            want,
            "{}",
            b.name
        );
        assert!(
            counted.counts().list >= 1,
            "expired listing fetched again: {:?}",
            counted.counts()
        );
        let stats = lake.stats().handle;
        assert!(
            stats.listings.expirations + stats.metadata.expirations > 0,
            "{}: {stats:?}",
            b.name
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configured_capacity_bounds_the_cache() {
    for b in backends("capacity") {
        b.write(&LakeSpec::small_files(24)).await;
        let capacity = 6;
        let lake = LakeCache::builder()
            .handle_capacity(capacity)
            .handle_listing_bytes(1 << 10)
            .max_open_files(4)
            .build()
            .unwrap();
        let store = b.cached(&b.counting(), &lake);
        let want = expected(&b, WORKLOAD[0]).await;
        for _ in 0..3 {
            assert_eq!(scan(&b, store.clone(), WORKLOAD[0]).await.unwrap(), want);
        }
        let stats = lake.stats().handle;
        assert!(stats.metadata.entries <= capacity, "{}: {stats:?}", b.name);
        assert!(stats.metadata.evictions > 0, "{}: {stats:?}", b.name);
        assert!(stats.files.entries <= 4, "{}: {stats:?}", b.name);
        assert_eq!(
            stats.listings.entries, 0,
            "a listing of 24 objects is larger than 1 KiB: {stats:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_concurrent_tasks_over_one_cache_return_the_plain_stores_rows() {
    for b in backends("concurrent") {
        b.write(&LakeSpec::small_files(10)).await;
        let lake = lake();
        let store = b.cached(&b.counting(), &lake);
        let b = Arc::new(b);
        let mut tasks = Vec::new();
        for task in 0..8 {
            let (b, store) = (Arc::clone(&b), store.clone());
            tasks.push(tokio::spawn(async move {
                let sql = WORKLOAD[task % WORKLOAD.len()];
                let mut results = Vec::new();
                for _ in 0..3 {
                    results.push(scan(&b, store.clone(), sql).await.unwrap());
                }
                (sql, results)
            }));
        }
        for task in tasks {
            let (sql, results) = task.await.unwrap();
            let want = expected(&b, sql).await;
            for got in results {
                assert_eq!(got, want, "{}: {sql}", b.name);
            }
        }
        assert!(lake.stats().handle.listings.hits > 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranged_reads_of_a_replaced_object_come_from_one_version() {
    for b in backends("if_match") {
        let lake = lake();
        let counted = b.counting();
        let store = b.cached(&counted, &lake);
        let path = b.prefix.clone().join("blob");
        store
            .put(&path, PutPayload::from(vec![1u8; 4 << 20]))
            .await
            .unwrap();
        store.head(&path).await.unwrap();
        // Replaced behind the cache's back by an object of the same size.
        b.raw
            .put(&path, PutPayload::from(vec![2u8; 4 << 20]))
            .await
            .unwrap();
        let ranges = [
            0..1000,
            (2 << 20)..(2 << 20) + 1000,
            (4 << 20) - 1000..(4 << 20),
        ];
        // The read is of the version the cache knew: refused, naming the file and both
        // versions, never a mix.
        let err = store.get_ranges(&path, &ranges).await.unwrap_err();
        let changed = datafusion_lakecache::VersionChanged::find(&err)
            .unwrap_or_else(|| panic!("{}: not a version change: {err}", b.name));
        assert_eq!(changed.path, path.to_string());
        assert!(
            lake.stats().handle.version_changes > 0,
            "{}: the change was noticed: {:?}",
            b.name,
            lake.stats().handle
        );
        // The next read is of the new version, whole.
        let got = store.get_ranges(&path, &ranges).await.unwrap();
        for bytes in &got {
            assert!(
                bytes.iter().all(|&x| x == 2),
                "{}: bytes of the new version only",
                b.name
            );
        }
    }
}
