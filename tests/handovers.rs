//! Every hand-over of bytes or decoded structures from one owner to another checks the version
//! it hands to: a reader that planned version V receives only V's bytes and V's footer, and a
//! validator that is not a content digest matches only within the store that showed it.
//! Each test forces its sequence with a stand-in store (`testkit::RaceStore`, stores whose
//! e_tags are counters) rather than waiting for timing to bring it about; docs/reliability.md
//! lists every hand-over point and its test.
//!
//! Versions of one file differ in values only (`testkit::lake::same_layout_file_in`): the same
//! size and layout, with statistics that rule out each other's rows. A reader that pruned one
//! version's bytes by the other's statistics answers 0 rows where DataFusion answers 2,000.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{remote_backends, rows, sorted_lines};
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use datafusion_lakecache::testkit::RaceStore;
use datafusion_lakecache::testkit::lake::same_layout_file_in;
use datafusion_lakecache::{CachingObjectStore, LakeCache};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use url::Url;

const ROWS: usize = 2_000;
/// The middle of the values' range: the high version has none below it, the low one all.
const MID: i64 = (1 << 24) + (1 << 23);

fn sql() -> String {
    format!("SELECT count(*) AS n, min(value) AS low FROM t WHERE value < {MID}")
}

/// A version of a file whose values all lie above [`MID`].
fn high(seed: u64) -> Bytes {
    same_layout_file_in(ROWS, seed, 1 << 23..1 << 24).unwrap()
}

/// A version of the same size and layout whose values all lie below [`MID`].
fn low(seed: u64) -> Bytes {
    same_layout_file_in(ROWS, seed, 0..1 << 23).unwrap()
}

/// A new session installed from `lake`, with `store` registered at `url`.
fn session(lake: &LakeCache, url: &Url, store: Arc<dyn ObjectStore>) -> SessionContext {
    let builder = SessionStateBuilder::new().with_default_features();
    let ctx = SessionContext::new_with_state(lake.install(builder).unwrap().build());
    ctx.register_object_store(url, store);
    ctx
}

/// `sql()` over the table at `table` of `store` (registered at `url`), in plain DataFusion.
async fn vanilla(url: &Url, store: Arc<dyn ObjectStore>, table: &str) -> Vec<String> {
    let ctx = SessionContext::new();
    ctx.register_object_store(url, store);
    ctx.register_parquet("t", table, ParquetReadOptions::default())
        .await
        .unwrap();
    sorted_lines(&ctx.sql(&sql()).await.unwrap().collect().await.unwrap()).unwrap()
}

/// Sequence 1: a download of one version never becomes another version's footer.
///
/// A listing without e_tags names the file by size and time. The scan's prefetcher starts a
/// whole-file download at that version; the object is rewritten (same size, same second)
/// while the response is on its way; the reader's HEAD pins the new e_tag; the download lands
/// with the old bytes. Handing them over as the new version's footer kept the old footer under
/// the new e_tag, a content digest: another store identity proving it was then pruned by the
/// old statistics (0 rows where DataFusion answers 2,000).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_of_the_old_version_is_never_the_new_versions_footer() {
    for b in remote_backends("handover_download") {
        let path = b.prefix.clone().join("f0.parquet");
        b.raw.put(&path, high(1).into()).await.unwrap();
        let before = vanilla(&b.store_url, Arc::clone(&b.raw), &b.table_url()).await;
        // Nothing read at registration (no footers on listing, a declared schema, no
        // statistics): the reader's pin is the first to show an e_tag.
        let lake = LakeCache::builder()
            .index_on_listing(false)
            .build()
            .unwrap();
        let race = Arc::new(RaceStore::new(Arc::clone(&b.raw)).without_listed_e_tags());
        let ctx = session(&lake, &b.store_url, race.clone());
        ctx.sql("SET datafusion.execution.collect_statistics = false")
            .await
            .unwrap();
        let table = format!(
            "CREATE EXTERNAL TABLE t (id BIGINT NOT NULL, value BIGINT NOT NULL) \
             STORED AS PARQUET LOCATION '{}'",
            b.table_url()
        );
        ctx.sql(&table).await.unwrap();
        race.rewrite_during_get(&path, low(2));
        let got = rows(&ctx, &sql()).await;
        let after = vanilla(&b.store_url, Arc::clone(&b.raw), &b.table_url()).await;
        assert_ne!(before, after, "the versions answer differently");
        match got {
            Ok(got) => assert!(
                got == before || got == after,
                "{}: {got:?} is neither version's answer ({before:?}, {after:?})",
                b.name
            ),
            Err(e) => assert!(
                e.to_string().contains("f0.parquet") && e.to_string().contains("changed"),
                "{}: {e}",
                b.name
            ),
        }
        // Another store identity over the new version: whatever the caches kept of it must
        // be its own.
        // Another store identity over the new version: whatever the caches kept of it must
        // be its own.
        let other = session(&lake, &b.store_url, b.counting());
        other
            .register_parquet("t", b.table_url(), ParquetReadOptions::default())
            .await
            .unwrap();
        assert_eq!(rows(&other, &sql()).await.unwrap(), after, "{}", b.name);
        assert_eq!(rows(&ctx, &sql()).await.unwrap(), after, "{}", b.name);
    }
}

/// A footer loaded as a listing ends is kept under the version its reads showed, not under
/// the one recorded once the load is done: here the store's answer (the old bytes) comes
/// after a HEAD through another session of the same store recorded the rewrite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_footer_loaded_on_listing_is_kept_under_the_version_its_reads_showed() {
    for b in remote_backends("handover_warmup") {
        let path = b.prefix.clone().join("f0.parquet");
        b.raw.put(&path, high(1).into()).await.unwrap();
        let lake = LakeCache::builder().build().unwrap();
        let race = Arc::new(RaceStore::new(Arc::clone(&b.raw)).without_listed_e_tags());
        let store: Arc<dyn ObjectStore> = race.clone();
        // One store registered in two sessions: one identity.
        let (first, second) = (
            session(&lake, &b.store_url, Arc::clone(&store)),
            session(&lake, &b.store_url, Arc::clone(&store)),
        );
        race.rewrite_during_get(&path, low(2));
        let registering = tokio::spawn({
            let (first, table) = (first.clone(), b.table_url());
            async move {
                first
                    .register_parquet("t", table, ParquetReadOptions::default())
                    .await
            }
        });
        race.wait_for_rewrite().await;
        let registry = &second.runtime_env().object_store_registry;
        let wrapped = registry.get_store(&b.store_url).unwrap();
        wrapped.head(&path).await.unwrap();
        registering.await.unwrap().unwrap();
        let after = vanilla(&b.store_url, Arc::clone(&b.raw), &b.table_url()).await;
        let other = session(&lake, &b.store_url, b.counting());
        other
            .register_parquet("t", b.table_url(), ParquetReadOptions::default())
            .await
            .unwrap();
        assert_eq!(rows(&other, &sql()).await.unwrap(), after, "{}", b.name);
        assert_eq!(rows(&first, &sql()).await.unwrap(), after, "{}", b.name);
    }
}

/// Sequence 2: one store's footer is never taken for another store's object at the same path.
///
/// One session, two in-memory stores whose e_tags are counters, each holding `t/f0.parquet`
/// of the same size under e_tag "0". DataFusion's planning cache keys footers by path alone:
/// the footer it decoded last (store two's) was taken as store one's because path, size and
/// validator agreed, and one's file was pruned by two's statistics. The S3 server's e_tags
/// are MD5 digests, which name the bytes, so the sequence cannot happen there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_stores_planning_footer_is_never_another_stores_at_the_same_path() {
    for on_listing in [false, true] {
        let (one_url, two_url) = (
            Url::parse("memory://one").unwrap(),
            Url::parse("memory://two").unwrap(),
        );
        let one: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let two: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let path = Path::from("t/f0.parquet");
        one.put(&path, low(1).into()).await.unwrap();
        two.put(&path, high(2).into()).await.unwrap();
        let (e_one, e_two) = (
            one.head(&path).await.unwrap(),
            two.head(&path).await.unwrap(),
        );
        assert_eq!((e_one.e_tag, e_one.size), (e_two.e_tag, e_two.size));
        let want_one = vanilla(&one_url, Arc::clone(&one), "memory://one/t/").await;
        let want_two = vanilla(&two_url, Arc::clone(&two), "memory://two/t/").await;
        assert_ne!(want_one, want_two);
        let lake = LakeCache::builder()
            .index_on_listing(on_listing)
            .build()
            .unwrap();
        let ctx = session(&lake, &one_url, one);
        ctx.register_object_store(&two_url, two);
        for (name, url) in [("one", &one_url), ("two", &two_url)] {
            let sql = format!("CREATE EXTERNAL TABLE {name} STORED AS PARQUET LOCATION '{url}/t/'");
            ctx.sql(&sql).await.unwrap();
        }
        for round in 0..2 {
            for (name, want) in [("one", &want_one), ("two", &want_two)] {
                let sql = sql().replace("FROM t", &format!("FROM {name}"));
                assert_eq!(
                    &rows(&ctx, &sql).await.unwrap(),
                    want,
                    "footers on listing {on_listing}, round {round}, table {name}"
                );
            }
        }
    }
}

/// Sequence 3: recording an object's metadata over an entry that expired and was not swept
/// yet keeps the object indexed, so forgetting it forgets what was recorded: the next read
/// is made at the store's version, not at the one recorded before it was rewritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forgetting_an_object_recorded_over_an_expired_entry_forgets_it() {
    for b in remote_backends("handover_expired") {
        let ttl = Duration::from_millis(100);
        let lake = LakeCache::builder().handle_ttl(ttl).build().unwrap();
        let store = CachingObjectStore::new(Arc::clone(&b.raw), &b.store_url, &lake);
        let path = b.prefix.clone().join("f0.parquet");
        b.raw.put(&path, high(1).into()).await.unwrap();
        store.head(&path).await.unwrap();
        // Past the TTL, recorded again over the expired entry.
        tokio::time::sleep(ttl * 3).await;
        store.head(&path).await.unwrap();
        // Rewritten behind the wrapper's back, then forgotten as a user would after it.
        b.raw.put(&path, low(2).into()).await.unwrap();
        lake.invalidate(&b.store_url, &path);
        assert_eq!(
            lake.stats().handle.metadata.entries,
            0,
            "{}: nothing recorded is left",
            b.name
        );
        let read = store.get(&path).await.unwrap().bytes().await.unwrap();
        assert_eq!(read, low(2), "{}: the store's version", b.name);
    }
}
