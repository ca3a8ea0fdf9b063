use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::{TimeZone, Utc};
use object_store::ObjectMeta;
use object_store::path::Path;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaDataReader};

use super::*;
use crate::object::{StoreKey, Validator};
use crate::testkit::lake::{LakeSpec, file_bytes};

fn footer(seed: u64) -> Arc<ParquetMetaData> {
    let bytes = file_bytes(&LakeSpec::small_files(1).with_seed(seed), 0).unwrap();
    let meta = ParquetMetaDataReader::new()
        .with_page_index_policy(PageIndexPolicy::Optional)
        .parse_and_finish(&bytes)
        .unwrap();
    Arc::new(meta)
}

fn me() -> StoreIdentity {
    StoreIdentity::named("me")
}

fn version(path: &str, e_tag: &str) -> ObjectVersion {
    ObjectVersion::new(
        StoreKey::of(&url::Url::parse("s3://bucket").unwrap()),
        &me(),
        &ObjectMeta {
            location: Path::from(path),
            last_modified: Utc.timestamp_opt(1_700_000_000, 0).unwrap(),
            size: 1000,
            e_tag: Some(e_tag.into()),
            version: None,
        },
    )
}

/// Waits until `n` callers have started: every caller increments `started` in the same poll
/// in which it joins (or starts) the load, so once all have, none can arrive after the load
/// ended, however slowly a loaded machine schedules them.
async fn all_started(started: &AtomicUsize, n: usize) {
    for _ in 0..5_000 {
        if started.load(Ordering::SeqCst) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!(
        "only {} of {n} callers started",
        started.load(Ordering::SeqCst)
    );
}

fn cache(capacity_bytes: u64) -> IndexCache {
    IndexCache::try_new(IndexConfig {
        capacity_bytes,
        ..IndexConfig::default()
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_misses_make_one_load() {
    let cache = cache(64 << 20);
    let loads = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(AtomicUsize::new(0));
    let object = version("a.parquet", "v1");
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (cache, object) = (cache.clone(), object.clone());
            let (loads, started) = (Arc::clone(&loads), Arc::clone(&started));
            tokio::spawn(async move {
                started.fetch_add(1, Ordering::SeqCst);
                let gate = Arc::clone(&started);
                cache
                    .metadata(&object, &me(), async move {
                        loads.fetch_add(1, Ordering::SeqCst);
                        all_started(&gate, 16).await;
                        Ok(footer(1))
                    })
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    assert_eq!(loads.load(Ordering::SeqCst), 1);
    assert!(
        results.iter().all(|(m, _)| Arc::ptr_eq(m, &results[0].0)),
        "one shared value"
    );
    assert_eq!(
        results.iter().filter(|(_, hit)| !hit).count(),
        1,
        "one miss"
    );
    let stats = cache.stats();
    assert_eq!(stats.footer_loads, 1);
    assert_eq!(stats.footers.entries, 1);
    // A later lookup is a hit without a load.
    let (_, hit) = cache
        .metadata(&object, &me(), async { panic!("no load on a hit") })
        .await
        .unwrap();
    assert!(hit);
    assert_eq!(cache.loads_in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_load_reaches_every_waiter_of_its_identity_and_is_not_kept() {
    let cache = cache(64 << 20);
    let object = version("bad.parquet", "v1");
    let started = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let (cache, object, started) = (cache.clone(), object.clone(), Arc::clone(&started));
            tokio::spawn(async move {
                started.fetch_add(1, Ordering::SeqCst);
                cache
                    .metadata(&object, &me(), async move {
                        all_started(&started, 4).await;
                        Err(DataFusionError::Execution(
                            "bad.parquet: corrupt footer".into(),
                        ))
                    })
                    .await
            })
        })
        .collect();
    for t in tasks {
        let err = t.await.unwrap().unwrap_err();
        assert!(
            err.to_string().contains("bad.parquet: corrupt footer"),
            "{err}"
        );
    }
    assert_eq!(cache.stats().footer_loads, 1);
    let (m, _) = cache
        .metadata(&object, &me(), async { Ok(footer(1)) })
        .await
        .unwrap();
    assert_eq!(m.num_row_groups(), 1);
    assert_eq!(cache.stats().footer_loads, 2, "the failure was not cached");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_load_is_an_error_and_the_next_load_runs() {
    let cache = cache(64 << 20);
    let object = version("p.parquet", "v1");
    let err = cache
        .metadata(&object, &me(), async { panic!("a decoder bug") })
        .await
        .unwrap_err();
    assert!(err.to_string().contains("panicked"), "{err}");
    assert_eq!(
        cache.loads_in_flight(),
        0,
        "not left in the single-flight map"
    );
    let (m, hit) = cache
        .metadata(&object, &me(), async { Ok(footer(1)) })
        .await
        .unwrap();
    assert!(!hit && m.num_row_groups() == 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_nobody_waits_for_is_aborted_and_drops_what_it_holds() {
    let cache = cache(64 << 20);
    let object = version("slow.parquet", "v1");
    // Stands for what a load captures from its query: a prefetch lease, a reservation.
    let held = Arc::new(());
    let captured = Arc::clone(&held);
    let identity = me();
    let waiting = cache.metadata(&object, &identity, async move {
        let _keep = captured;
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Ok(footer(1))
    });
    // The query is dropped while its footer loads.
    let _ = tokio::time::timeout(Duration::from_millis(50), waiting).await;
    for _ in 0..100 {
        if Arc::strong_count(&held) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(Arc::strong_count(&held), 1, "the load was aborted");
    assert_eq!(cache.loads_in_flight(), 0);
}

#[tokio::test]
async fn versions_are_separate_entries_and_a_version_can_be_dropped() {
    let cache = cache(64 << 20);
    let v1 = version("f.parquet", "v1");
    let v2 = version("f.parquet", "v2");
    cache
        .metadata(&v1, &me(), async { Ok(footer(1)) })
        .await
        .unwrap();
    cache
        .bloom_filter(&v1, &me(), 0, 0, async {
            Ok(Some(Bytes::from_static(b"bits")))
        })
        .await
        .unwrap();
    let (m2, _) = cache
        .metadata(&v2, &me(), async { Ok(footer(2)) })
        .await
        .unwrap();
    assert_eq!(cache.stats().footer_loads, 2);
    cache.invalidate_version(&v1);
    assert!(cache.cached_metadata(&v1).is_none(), "old version gone");
    assert!(Arc::ptr_eq(&cache.cached_metadata(&v2).unwrap(), &m2));
    cache.inner.entries.run_pending_tasks();
    let stats = cache.stats();
    assert_eq!(stats.footers.entries, 1, "{stats:?}");
}

#[tokio::test]
async fn bloom_filters_and_their_absence_are_cached_in_buffers_of_their_own() {
    let cache = cache(64 << 20);
    let v = version("f.parquet", "v1");
    let download = Bytes::from(vec![7u8; 1 << 20]);
    for _ in 0..3 {
        let (none, _) = cache
            .bloom_filter(&v, &me(), 1, 2, async { Ok(None) })
            .await
            .unwrap();
        assert!(none.is_none());
        let slice = download.slice(100..164);
        let (some, _) = cache
            .bloom_filter(&v, &me(), 0, 0, async move { Ok(Some(slice)) })
            .await
            .unwrap();
        assert_eq!(some.as_deref(), Some(&[7u8; 64][..]));
    }
    assert_eq!(cache.stats().bloom_loads, 2);
    // Had the entry kept the slice, the download's megabyte would live on behind 64 bytes.
    let (kept, _) = cache
        .bloom_filter(&v, &me(), 0, 0, async { panic!("cached") })
        .await
        .unwrap();
    let (at, base) = (kept.unwrap().as_ptr() as usize, download.as_ptr() as usize);
    assert!(
        at < base || at >= base + download.len(),
        "the entry has a buffer of its own"
    );
}

#[tokio::test]
async fn large_entries_are_refused_and_the_capacity_holds() {
    let one = footer(1).memory_size() as u64;
    // Room for about three footers; one footer is more than a quarter of it.
    let cache = cache(one * 3 + 1000);
    let (m, _) = cache
        .metadata(&version("big", "v"), &me(), async { Ok(footer(1)) })
        .await
        .unwrap();
    assert_eq!(m.num_row_groups(), 1, "the caller still gets its value");
    let stats = cache.stats();
    assert_eq!((stats.rejected, stats.footers.entries), (1, 0), "{stats:?}");

    let cache = IndexCache::try_new(IndexConfig {
        capacity_bytes: one * 3 + 1000,
        max_entry_percent: 100,
        ..IndexConfig::default()
    })
    .unwrap();
    for i in 0..20 {
        let v = version(&format!("f{i}"), "v");
        cache
            .metadata(&v, &me(), async { Ok(footer(1)) })
            .await
            .unwrap();
        cache
            .metadata(&v, &me(), async { Ok(footer(1)) })
            .await
            .unwrap();
    }
    let stats = cache.stats();
    assert!(stats.bytes <= one * 3 + 1000, "{stats:?}");
    assert!(stats.footers.evictions > 0, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_load_failed_on_another_identitys_error_loads_with_its_own_store() {
    let cache = cache(64 << 20);
    // A version named by its content: shared by identities that have shown it.
    let object = version("shared.parquet", "9e107d9d372bb6826bd81d3542a419d6");
    assert!(object.owner().is_none());
    let (refused, reader) = (
        StoreIdentity::named("refused"),
        StoreIdentity::named("reader"),
    );
    let (gate, go) = tokio::sync::oneshot::channel::<()>();
    let failing = {
        let (cache, object) = (cache.clone(), object.clone());
        tokio::spawn(async move {
            cache
                .metadata(&object, &refused, async move {
                    let _ = go.await;
                    Err(DataFusionError::Execution("PermissionDenied".into()))
                })
                .await
        })
    };
    while cache.loads_in_flight() == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let joining = {
        let (cache, object) = (cache.clone(), object.clone());
        tokio::spawn(async move {
            cache
                .metadata(&object, &reader, async { Ok(footer(1)) })
                .await
        })
    };
    // The reader has joined the refused store's load (it is counted as a lookup) when it
    // fails.
    while cache.stats().footers.misses + cache.stats().footers.hits < 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    gate.send(()).unwrap();
    let err = failing.await.unwrap().unwrap_err();
    assert!(err.to_string().contains("PermissionDenied"), "{err}");
    let (m, _) = joining.await.unwrap().expect("the reader's own load");
    assert_eq!(m.num_row_groups(), 1);
    let stats = cache.stats();
    assert_eq!((stats.reloads, stats.footer_loads), (1, 2), "{stats:?}");
}

#[tokio::test]
async fn footers_of_versions_known_by_their_time_alone_are_not_kept() {
    let cache = cache(64 << 20);
    let store = StoreKey::of(&url::Url::parse("s3://bucket").unwrap());
    let validator = Validator::Unvalidated {
        modified: 1_700_000_000_000_000,
        weak: None,
    };
    let v = ObjectVersion::with_validator(store, &me(), "t.parquet".into(), 1000, validator);
    for _ in 0..2 {
        let (m, hit) = cache
            .metadata(&v, &me(), async { Ok(footer(1)) })
            .await
            .unwrap();
        assert!(!hit && m.num_row_groups() == 1);
    }
    let stats = cache.stats();
    assert_eq!(
        (stats.footer_loads, stats.footers.entries),
        (2, 0),
        "{stats:?}"
    );
}
