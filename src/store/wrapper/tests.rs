#![allow(clippy::single_range_in_vec_init)] // one-range reads are the common case here

use super::*;
use crate::config::{HandleConfig, IndexConfig, RangeConfig};
use crate::index::IndexCache;
use crate::object::VersionChanged;
use crate::range::RangeCache;
use crate::testkit::{CloudMetadata, CountingStore, FaultStore, Op};
use futures::TryStreamExt;
use object_store::ObjectStoreExt;
use object_store::memory::InMemory;

type Faulty = Arc<FaultStore<InMemory>>;
type Counted = Arc<CountingStore<Faulty>>;
type Stack = CachingObjectStore<Counted>;

fn caches() -> Caches {
    Caches::new(
        HandleCache::try_new(HandleConfig::default()).unwrap(),
        IndexCache::try_new(IndexConfig::default()).unwrap(),
        RangeCache::try_new(RangeConfig::default()).unwrap(),
    )
}

fn stack() -> (Stack, Counted, Faulty) {
    let faults = Arc::new(FaultStore::new(InMemory::new()));
    let counted = Arc::new(CountingStore::new(Arc::clone(&faults)));
    let url = Url::parse("memory://").unwrap();
    let store = CachingObjectStore::new(Arc::clone(&counted), &url, &caches());
    (store, counted, faults)
}

async fn put(store: &impl ObjectStore, path: &str, body: &'static [u8]) {
    store
        .put(&Path::from(path), PutPayload::from_static(body))
        .await
        .unwrap();
}

async fn list(store: &impl ObjectStore, prefix: &str) -> Vec<String> {
    let listed: Vec<ObjectMeta> = store
        .list(Some(&Path::from(prefix)))
        .try_collect()
        .await
        .unwrap();
    let mut names: Vec<String> = listed.into_iter().map(|m| m.location.to_string()).collect();
    names.sort();
    names
}

#[test]
fn a_wrapper_is_recognised_by_its_display_alone() {
    let (store, _, _) = stack();
    let as_dyn: Arc<dyn ObjectStore> = Arc::new(store.clone());
    assert_eq!(wrapper_id(as_dyn.as_ref()), Some(store.id));
    let found = store.reads.caches().directory.find(&as_dyn).unwrap();
    assert_eq!(found.store_key().as_str(), "memory://");
    let other: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    assert_eq!(wrapper_id(other.as_ref()), None);
}

#[tokio::test]
async fn heads_and_listings_are_served_from_the_cache() {
    let (store, counted, _) = stack();
    put(&store, "d/a", b"aaaa").await;
    put(&store, "d/b", b"bb").await;
    counted.reset();
    assert_eq!(list(&store, "d").await, ["d/a", "d/b"]);
    assert_eq!(list(&store, "d").await, ["d/a", "d/b"]);
    // A listing shows names, not that they can be read: the first HEAD is asked of the
    // store, the next one is answered from the cache.
    for _ in 0..2 {
        assert_eq!(store.head(&Path::from("d/a")).await.unwrap().size, 4);
    }
    let delimited = store
        .list_with_delimiter(Some(&Path::from("d")))
        .await
        .unwrap();
    assert_eq!(delimited.objects.len(), 2);
    store
        .list_with_delimiter(Some(&Path::from("d")))
        .await
        .unwrap();
    let c = counted.counts();
    assert_eq!(
        (c.list, c.head),
        (2, 1),
        "one recursive and one delimited listing, one HEAD"
    );
    let stats = store.handle_stats();
    assert_eq!(stats.listings.hits, 2);
    assert_eq!(stats.metadata.hits, 1);
}

#[tokio::test]
async fn writes_through_the_wrapper_invalidate_what_they_touch() {
    let (store, counted, _) = stack();
    put(&store, "d/a", b"aaaa").await;
    assert_eq!(list(&store, "d").await, ["d/a"]);
    put(&store, "d/b", b"bb").await;
    assert_eq!(
        list(&store, "d").await,
        ["d/a", "d/b"],
        "put drops the parent listing"
    );
    store
        .copy(&Path::from("d/a"), &Path::from("d/c"))
        .await
        .unwrap();
    assert_eq!(list(&store, "d").await, ["d/a", "d/b", "d/c"]);
    store
        .rename(&Path::from("d/c"), &Path::from("e/c"))
        .await
        .unwrap();
    assert_eq!(list(&store, "d").await, ["d/a", "d/b"]);
    store.delete(&Path::from("d/a")).await.unwrap();
    assert_eq!(list(&store, "d").await, ["d/b"]);
    let err = store.head(&Path::from("d/a")).await.unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err}");
    let mut upload = store.put_multipart(&Path::from("d/m")).await.unwrap();
    upload
        .put_part(PutPayload::from_static(b"mmm"))
        .await
        .unwrap();
    upload.complete().await.unwrap();
    assert_eq!(list(&store, "d").await, ["d/b", "d/m"]);
    assert_eq!(store.head(&Path::from("d/b")).await.unwrap().size, 2);
    counted.reset();
    for _ in 0..2 {
        store.head(&Path::from("d/m")).await.unwrap();
    }
    assert_eq!(
        counted.counts().head,
        1,
        "a write proves nothing; its HEAD does"
    );
}

#[tokio::test]
async fn a_replaced_object_fails_once_naming_both_versions_then_reads_its_new_version() {
    let (store, counted, faults) = stack();
    let path = Path::from("f");
    put(&store, "f", b"0123456789").await;
    store.head(&path).await.unwrap();
    // Replaced behind the cache's back, with the same size.
    faults
        .put(&path, PutPayload::from_static(b"abcdefghij"))
        .await
        .unwrap();
    counted.reset();
    let err = store
        .get_ranges(&path, &[0..2, 5..7, 8..10])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Precondition { .. }), "{err}");
    let changed = VersionChanged::find(&err).unwrap();
    assert_eq!(changed.path, "f");
    assert!(err.to_string().contains("10 bytes"), "{err}");
    assert_eq!(store.handle_stats().version_changes, 1);
    // The old version is forgotten: the next read learns the new one.
    let got = store.get_ranges(&path, &[0..2, 5..7, 8..10]).await.unwrap();
    assert_eq!(got, [&b"ab"[..], &b"fg"[..], &b"ij"[..]]);
    let c = counted.counts();
    assert_eq!(
        (c.head, c.get),
        (1, 2),
        "refused GET; HEAD of the new version, GET"
    );
    // Replaced again: bytes the range cache holds are still the known version's, whole.
    faults
        .put(&path, PutPayload::from_static(b"ZYXWVUTSRQ"))
        .await
        .unwrap();
    counted.reset();
    assert_eq!(&store.get_range(&path, 0..3).await.unwrap()[..], b"abc");
    assert_eq!(counted.counts().get, 0, "from the range cache");
    // Once the caches let the old version go (its TTL, or a clear), the new one is read.
    store.handles().clear();
    store.reads.caches().ranges.clear();
    assert_eq!(&store.get_range(&path, 0..3).await.unwrap()[..], b"ZYX");
}

#[tokio::test]
async fn a_refused_if_match_is_a_typed_error() {
    let (store, _, faults) = stack();
    let path = Path::from("f");
    put(&store, "f", b"0123456789").await;
    store.head(&path).await.unwrap();
    faults.fail(Op::Changed, 1);
    let err = store.get_ranges(&path, &[0..2, 4..6]).await.unwrap_err();
    let changed = VersionChanged::find(&err).unwrap_or_else(|| panic!("not typed: {err}"));
    assert_eq!(changed.path, "f");
    assert!(err.to_string().contains("run the query again"), "{err}");
    // Once it holds still, reads work again.
    assert_eq!(
        store.get_ranges(&path, &[0..2, 4..6]).await.unwrap().len(),
        2
    );
}

#[tokio::test]
async fn a_listing_that_raced_a_write_does_not_bring_the_old_version_back() {
    let (store, counted, _) = stack();
    let path = Path::from("d/a");
    put(&store, "d/a", b"old bytes!").await;
    // The listing's page is fetched before the write...
    let listing = store.list(Some(&Path::from("d")));
    put(&store, "d/a", b"new bytes!").await;
    // ...and consumed after it.
    let seen: Vec<ObjectMeta> = listing.try_collect().await.unwrap();
    assert_eq!(seen.len(), 1);
    counted.reset();
    let got = store.get_range(&path, 0..10).await.unwrap();
    assert_eq!(&got[..], b"new bytes!");
    assert_eq!(counted.counts().head, 1, "the old listing recorded nothing");
    // Nor was the racing listing cached.
    assert_eq!(list(&store, "d").await, ["d/a"]);
    assert_eq!(counted.counts().list, 1);
}

#[tokio::test]
async fn versions_on_gets_but_not_on_listings_are_one_version() {
    let counted = Arc::new(CountingStore::new(CloudMetadata::gcs(InMemory::new())));
    let url = Url::parse("gs://bucket").unwrap();
    let caches = caches();
    let store = CachingObjectStore::new(Arc::clone(&counted), &url, &caches);
    put(&store, "d/a", b"0123456789").await;
    assert_eq!(list(&store, "d").await, ["d/a"]);
    for _ in 0..3 {
        let got = store.get_ranges(&Path::from("d/a"), &[0..4]).await.unwrap();
        assert_eq!(&got[0][..], b"0123");
        assert_eq!(list(&store, "d").await, ["d/a"]);
    }
    let c = counted.counts();
    assert_eq!((c.list, c.get), (1, 1), "one listing, one data GET: {c:?}");
    assert_eq!(store.handle_stats().version_changes, 0);
}

#[tokio::test]
async fn failed_requests_are_not_cached() {
    let (store, counted, faults) = stack();
    put(&store, "d/a", b"aaaa").await;
    faults.fail(Op::Head, 1);
    assert!(store.head(&Path::from("d/a")).await.is_err());
    assert_eq!(store.head(&Path::from("d/a")).await.unwrap().size, 4);

    faults.fail(Op::List, 1);
    let failed: Result<Vec<ObjectMeta>> = store.list(Some(&Path::from("d"))).try_collect().await;
    assert!(failed.unwrap_err().to_string().contains("injected"));
    counted.reset();
    assert_eq!(list(&store, "d").await, ["d/a"]);
    assert_eq!(
        counted.counts().list,
        1,
        "the failed listing was not cached"
    );

    faults.fail(Op::List, 1);
    assert!(
        store
            .list_with_delimiter(Some(&Path::from("d")))
            .await
            .is_err()
    );
    let listed = store
        .list_with_delimiter(Some(&Path::from("d")))
        .await
        .unwrap();
    assert_eq!(listed.objects.len(), 1);

    faults.fail(Op::Get, 1);
    assert!(store.get_range(&Path::from("d/a"), 0..4).await.is_err());
    assert_eq!(
        &store.get_range(&Path::from("d/a"), 0..4).await.unwrap()[..],
        b"aaaa"
    );
}

#[tokio::test]
async fn bad_ranges_are_refused_naming_the_file() {
    let (store, _, _) = stack();
    put(&store, "f", b"0123456789").await;
    let path = Path::from("f");
    store.get_range(&path, 0..4).await.unwrap();
    #[allow(clippy::reversed_empty_ranges)]
    let reversed = 6..2;
    for bad in [reversed, 5..11] {
        let err = store.get_ranges(&path, &[bad]).await.unwrap_err();
        assert!(err.to_string().contains("not within its 10 bytes"), "{err}");
    }
}

#[tokio::test]
async fn a_missing_object_is_reported_and_forgotten() {
    let (store, _, faults) = stack();
    put(&store, "gone", b"xx").await;
    store.head(&Path::from("gone")).await.unwrap();
    faults.delete(&Path::from("gone")).await.unwrap();
    let err = store
        .get_ranges(&Path::from("gone"), &[0..1, 1..2])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err}");
    let err = store.head(&Path::from("gone")).await.unwrap_err();
    assert!(
        matches!(err, Error::NotFound { .. }),
        "the cached entry was dropped: {err}"
    );
}

#[tokio::test]
async fn a_table_log_is_listed_fresh_and_its_pointer_read_fresh_by_any_read() {
    let (store, counted, faults) = stack();
    put(
        &store,
        "t/_delta_log/00000000000000000000.json",
        b"{\"commit\":0}",
    )
    .await;
    put(&store, "t/_delta_log/_last_checkpoint", b"{\"version\":0}").await;
    let pointer = Path::from("t/_delta_log/_last_checkpoint");
    let commit = Path::from("t/_delta_log/00000000000000000000.json");
    for _ in 0..2 {
        list(&store, "t/_delta_log").await;
        store.get_ranges(&pointer, &[0..4]).await.unwrap();
        store.get(&commit).await.unwrap().bytes().await.unwrap();
    }
    let c = counted.counts();
    // Both listings and both reads of the pointer reached the store; the commit, written
    // once, was read once.
    assert_eq!((c.list, c.get), (2, 3), "{:?}", counted.gets());
    // The pointer rewritten behind the wrapper's back: the next ranged read sees it.
    faults
        .put(&pointer, PutPayload::from_static(b"{\"version\":9}"))
        .await
        .unwrap();
    let bytes = store.get_ranges(&pointer, &[0..13]).await.unwrap();
    assert_eq!(bytes[0].as_ref(), b"{\"version\":9}");
}

/// A store whose listings carry no e_tags (some S3-compatible servers' do not), and which
/// rewrites its object, at the same size, between the responses of one coalesced read: the
/// response for the range at 0 comes from the first version, every later one from the second.
#[derive(Debug)]
struct RewritesBetweenResponses {
    inner: InMemory,
    rewritten: tokio::sync::Notify,
    done: std::sync::atomic::AtomicBool,
}

impl std::fmt::Display for RewritesBetweenResponses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RewritesBetweenResponses")
    }
}

#[async_trait]
impl ObjectStore for RewritesBetweenResponses {
    async fn put_opts(&self, l: &Path, p: PutPayload, o: PutOptions) -> Result<PutResult> {
        self.inner.put_opts(l, p, o).await
    }
    async fn put_multipart_opts(
        &self,
        l: &Path,
        o: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(l, o).await
    }
    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        use std::sync::atomic::Ordering::SeqCst;
        let first = matches!(&options.range, Some(GetRange::Bounded(r)) if r.start == 0);
        if !first {
            // Served only once the object was rewritten.
            while !self.done.load(SeqCst) {
                let wait = self.rewritten.notified();
                if self.done.load(SeqCst) {
                    break;
                }
                wait.await;
            }
            return self.inner.get_opts(location, options).await;
        }
        let result = self.inner.get_opts(location, options).await?;
        let body = result.bytes().await?;
        let meta = self.inner.head(location).await?;
        let rewritten = vec![b'2'; meta.size as usize];
        self.inner.put(location, rewritten.into()).await?;
        self.done.store(true, SeqCst);
        self.rewritten.notify_waiters();
        Ok(GetResult {
            payload: GetResultPayload::Stream(stream::iter([Ok(body)]).boxed()),
            range: 0..1000,
            meta,
            attributes: Attributes::default(),
        })
    }
    fn delete_stream(
        &self,
        l: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(l)
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner
            .list(prefix)
            .map(|m| m.map(|m| ObjectMeta { e_tag: None, ..m }))
            .boxed()
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(&self, from: &Path, to: &Path, o: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, o).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_are_kept_only_under_a_version_every_response_showed() {
    let inner = RewritesBetweenResponses {
        inner: InMemory::new(),
        rewritten: tokio::sync::Notify::new(),
        done: Default::default(),
    };
    let url = Url::parse("memory://").unwrap();
    let caches = caches();
    let store = CachingObjectStore::new(inner, &url, &caches);
    let path = Path::from("f");
    // Two ranges too far apart to coalesce: two requests.
    let size = 4 << 20;
    store
        .inner()
        .inner
        .put(&path, vec![b'1'; size].into())
        .await
        .unwrap();
    let listed = list(&store, "").await;
    assert_eq!(listed, ["f"]);
    let listed = store.handles().peek(&store.reads.seen(&path)).unwrap();
    let version = store.reads.version(&listed);
    assert!(!version.pins_bytes(), "known by size and time alone");
    let ranges = [0..1000, (3 << 20)..(3 << 20) + 1000];
    let read = store.reads.read(&version, &ranges, None).await;
    // The responses showed two versions: the read fails rather than mix them, and keeps
    // nothing under either (had it kept them under the second, later readers guarded by its
    // e_tag would be served the first version's bytes without a request).
    let err = read.expect_err("two versions in one read");
    assert!(VersionChanged::find(&err).is_some(), "{err}");
    let now = store.inner().inner.head(&path).await.unwrap();
    let second = store.reads.version(&now);
    assert!(second.pins_bytes());
    for range in ranges {
        assert!(!caches.ranges.covers(&second, range.clone()), "{range:?}");
    }
    // A read at the second version gets its bytes.
    let got = store.reads.read(&second, &[0..1000], None).await.unwrap();
    assert!(got[0].iter().all(|&b| b == b'2'));
}

#[test]
fn a_listing_left_unread_when_the_runtime_shuts_down_is_dropped_once() {
    // A listing whose consumer stops early is read on in the background. When the runtime
    // shuts down, that background read is dropped, and must not be handed to the runtime
    // again (a closed runtime drops a task it is given at once, on the caller's stack, so
    // each such drop would spawn the next: a stack overflow).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let slow =
        crate::testkit::LatencyStore::new(InMemory::new(), std::time::Duration::from_secs(3600));
    let url = Url::parse("memory://").unwrap();
    let store = CachingObjectStore::new(slow, &url, &caches());
    runtime.block_on(async {
        // Dropped unread: the rest is read in the background, which waits an hour.
        drop(store.list(Some(&Path::from("d"))));
        tokio::task::yield_now().await;
    });
    drop(runtime);
}

/// Holds the end of the first listing it is told of forever (footers that are still loading
/// when the listing's consumer goes away); lets every later one end at once.
#[derive(Debug, Default)]
struct HoldsTheFirstEnd {
    entered: tokio::sync::Notify,
    calls: std::sync::atomic::AtomicUsize,
}

impl crate::store::AfterListing for HoldsTheFirstEnd {
    fn listed(
        &self,
        _: crate::store::StoreReads,
        _: Arc<crate::handle::Listing>,
    ) -> futures::future::BoxFuture<'static, ()> {
        self.entered.notify_one();
        let first = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
        Box::pin(async move {
            if first {
                futures::future::pending::<()>().await;
            }
        })
    }
}

#[tokio::test]
async fn a_listing_dropped_while_its_end_is_under_way_is_recorded_not_read_past_its_end() {
    // The store's listing had ended and its footers were loading when the consumer went
    // away. The rest is finished in the background, which must not read the listing again
    // (a cloud store's listing panics when polled past its end) and records it whole.
    let counted = Arc::new(CountingStore::new(InMemory::new()));
    for name in ["d/a.parquet", "d/b.parquet"] {
        put(counted.as_ref(), name, b"PAR1").await;
    }
    let hook = Arc::new(HoldsTheFirstEnd::default());
    let caches = caches().after_listing(Arc::clone(&hook) as _);
    let url = Url::parse("memory://").unwrap();
    let store = CachingObjectStore::new(Arc::clone(&counted), &url, &caches);
    counted.reset();
    let mut listing = store.list(Some(&Path::from("d")));
    for _ in 0..2 {
        listing.next().await.unwrap().unwrap();
    }
    tokio::select! {
        _ = listing.next() => panic!("the listing ended while its footers were loading"),
        _ = hook.entered.notified() => {}
    }
    drop(listing);
    // The next listing waits for the one finished in the background, then takes its record.
    assert_eq!(list(&store, "d").await, ["d/a.parquet", "d/b.parquet"]);
    assert_eq!(counted.counts().list, 1, "the listing was recorded");
}
